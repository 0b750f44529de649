"""Test and benchmark infrastructure shipped with the package: the network lab (`netlab.py`)."""
