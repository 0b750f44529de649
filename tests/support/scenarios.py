"""Small hand-made scenarios shared by several test modules."""

# 1 data node, 2 stages x 2 relays: the optimum (3 flows, cost 34) differs from greedy routing.
SMALL_TWO_STAGE = {
    "name": "small", "stages": 2,
    "nodes": [
        {"id": "d0", "role": "data", "capacity": 10},
        {"id": "a0", "role": "relay", "stage": 0, "capacity": 2},
        {"id": "a1", "role": "relay", "stage": 0, "capacity": 1},
        {"id": "b0", "role": "relay", "stage": 1, "capacity": 1},
        {"id": "b1", "role": "relay", "stage": 1, "capacity": 2},
    ],
    "links": [
        {"a": "d0", "b": "a0", "cost": 1}, {"a": "d0", "b": "a1", "cost": 6},
        {"a": "a0", "b": "b0", "cost": 2}, {"a": "a0", "b": "b1", "cost": 9},
        {"a": "a1", "b": "b0", "cost": 3}, {"a": "a1", "b": "b1", "cost": 4},
        {"a": "b0", "b": "d0", "cost": 1}, {"a": "b1", "b": "d0", "cost": 5},
    ],
}
