"""A local demo site (a paginated catalogue with switchable faults) for the demo and tests."""
