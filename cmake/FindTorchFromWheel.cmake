# Finds LibTorch inside the installed torch wheel (torch==2.13.0, CPU).
# We never build against another torch: the prefix comes from the Python
# interpreter that will import the extension.
if(NOT Torch_DIR)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE PHANTOM_TORCH_PREFIX
    OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE PHANTOM_TORCH_RESULT)
  if(NOT PHANTOM_TORCH_RESULT EQUAL 0)
    message(FATAL_ERROR "Could not import torch with ${Python3_EXECUTABLE}; run: pip install torch==2.13.0")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${PHANTOM_TORCH_PREFIX}")
endif()
find_package(Torch REQUIRED)
# TorchConfig puts its flags (ABI macro, etc.) in TORCH_CXX_FLAGS.
string(APPEND CMAKE_CXX_FLAGS " ${TORCH_CXX_FLAGS}")
get_filename_component(PHANTOM_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)
