"""dmlrepro."""

from dmlrepro.cpu_isa import pin_cpu_isa as _pin_cpu_isa

# before torch's first kernel: one instruction set on every x86-64 host (docs/training.md#bit-exactness)
_pin_cpu_isa()
