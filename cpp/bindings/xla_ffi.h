// flashcute._C's XLA FFI targets (built where the XLA FFI headers were found: FLASHCUTE_XLA_FFI).
#pragma once

#include <nanobind/nanobind.h>

// Adds xla_ffi_targets() (handler name -> PyCapsule) and XLA_FFI_API_VERSION to the module.
void add_xla_ffi_targets(nanobind::module_& m);
