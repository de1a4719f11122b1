# The GPU code the .cu libraries carry, chosen before enable_language(CUDA). Unless
# CMAKE_CUDA_ARCHITECTURES (-D) or the CUDAARCHS environment variable says otherwise: real sm_90
# code (H100, H200, GH200) and, where the toolkit has it, sm_100 (B200, GB200) with its PTX for
# later GPUs. Left to itself CMake takes nvcc's default (sm_75 under nvcc 13): an H100 would then
# JIT-compile PTX in every new process.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
  include(CheckLanguage)
  check_language(CUDA)
  set(_codes "")
  if(CMAKE_CUDA_COMPILER)
    execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-code
                    OUTPUT_VARIABLE _codes ERROR_QUIET)
  endif()
  if(_codes MATCHES "sm_100")
    set(_archs "90-real;100")
  else()
    set(_archs "90")
  endif()
  set(CMAKE_CUDA_ARCHITECTURES "${_archs}" CACHE STRING
      "GPU code to build (default: sm_90, and sm_100 where nvcc has it)")
  message(STATUS "CUDA architectures: ${CMAKE_CUDA_ARCHITECTURES} (set CUDAARCHS to change)")
endif()
