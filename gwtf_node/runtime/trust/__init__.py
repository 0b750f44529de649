"""Who may send what: certificates and roles (`authorize`), the signed DHT records, value checks on frames.

Imports `net/` and `ops/` of the runtime.
"""
