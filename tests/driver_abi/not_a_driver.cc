// A shared library that is not a phantom driver: it exports no
// ph_driver_get_table (tests/driver_abi, the loader's refusal).
extern "C" __attribute__((visibility("default"))) int not_a_driver(void) {
  return 0;
}
