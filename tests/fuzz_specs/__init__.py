"""Each op family's FFI fuzz spec, one module per family of ffi/families.inc."""
