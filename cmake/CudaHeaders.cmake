# Finds NVIDIA's CUDA headers: an explicit MEDUSA_CUDA_INCLUDE_DIR, else the installed toolkit,
# else the headers that NVIDIA's PyPI wheel (nvidia-cuda-runtime) ships. Sets CUDA_HEADERS_DIR
# and CUDA_HEADERS_SOURCE.
set(_candidates)
if(MEDUSA_CUDA_INCLUDE_DIR)
  list(APPEND _candidates "${MEDUSA_CUDA_INCLUDE_DIR}")
  set(_source "MEDUSA_CUDA_INCLUDE_DIR")
endif()
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  list(APPEND _candidates ${CUDAToolkit_INCLUDE_DIRS})
endif()
list(APPEND _candidates /usr/local/cuda/include)
find_package(Python COMPONENTS Interpreter QUIET)
if(Python_EXECUTABLE)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE _site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_site)
    file(GLOB _wheel_dirs "${_site}/nvidia/cu*/include" "${_site}/nvidia/cuda_runtime/include")
    list(APPEND _candidates ${_wheel_dirs})
  endif()
endif()

set(CUDA_HEADERS_DIR "")
foreach(dir IN LISTS _candidates)
  if(EXISTS "${dir}/cuda.h" AND EXISTS "${dir}/cuda_runtime_api.h" AND EXISTS "${dir}/cudaTypedefs.h")
    set(CUDA_HEADERS_DIR "${dir}")
    break()
  endif()
endforeach()
if(NOT CUDA_HEADERS_DIR)
  message(FATAL_ERROR
    "NVIDIA's CUDA headers (cuda.h, cuda_runtime_api.h, cudaTypedefs.h) were not found.\n"
    "Install the CUDA toolkit, or `pip install nvidia-cuda-runtime` for its headers, or pass "
    "-DMEDUSA_CUDA_INCLUDE_DIR=/path/to/include.")
endif()
if(CUDA_HEADERS_DIR MATCHES "/nvidia/")
  set(CUDA_HEADERS_SOURCE "pypi")
elseif(_source AND CUDA_HEADERS_DIR STREQUAL MEDUSA_CUDA_INCLUDE_DIR)
  set(CUDA_HEADERS_SOURCE "explicit")
else()
  set(CUDA_HEADERS_SOURCE "toolkit")
endif()
file(STRINGS "${CUDA_HEADERS_DIR}/cuda.h" _ver REGEX "^#define CUDA_VERSION [0-9]+")
string(REGEX REPLACE "^#define CUDA_VERSION ([0-9]+).*" "\\1" CUDA_HEADERS_VERSION "${_ver}")
message(STATUS "CUDA headers ${CUDA_HEADERS_VERSION} from ${CUDA_HEADERS_SOURCE}: ${CUDA_HEADERS_DIR}")
