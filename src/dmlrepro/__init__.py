"""dmlrepro."""
