# Sanitizer and fuzzing builds (clang only; see docs/testing.md).
#   -DLOONGFORGE_SANITIZE=address,undefined  instruments every target with ASan+UBSan; a UB report
#                                            aborts the process so ctest sees it as a failure.
#   -DLOONGFORGE_FUZZ=ON                     also builds the libFuzzer targets in fuzz/ (implies
#                                            -fsanitize=fuzzer-no-link on the library code).
set(LOONGFORGE_SANITIZE "" CACHE STRING "Comma-separated -fsanitize= list (e.g. address,undefined); empty: none")
option(LOONGFORGE_FUZZ "Build the libFuzzer targets in fuzz/ (clang)" OFF)

if(LOONGFORGE_FUZZ AND NOT LOONGFORGE_SANITIZE)
  set(LOONGFORGE_SANITIZE "address,undefined")
endif()

if(LOONGFORGE_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "LOONGFORGE_SANITIZE needs clang (configure with -DCMAKE_CXX_COMPILER=clang++-14); "
                        "the compiler is ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(LF_HAVE_CUDA)
    message(FATAL_ERROR "LOONGFORGE_SANITIZE builds host code only: configure with -DLOONGFORGE_CUDA=OFF")
  endif()
  set(lf_san_flags -fsanitize=${LOONGFORGE_SANITIZE} -fno-omit-frame-pointer -g)
  if(LOONGFORGE_SANITIZE MATCHES "undefined")
    # A UB report must fail the test that triggered it, not scroll past.
    list(APPEND lf_san_flags -fno-sanitize-recover=undefined)
  endif()
  if(LOONGFORGE_FUZZ)
    list(APPEND lf_san_flags -fsanitize=fuzzer-no-link)
  endif()
  add_compile_options(${lf_san_flags})  # host code only: CUDA is off in these builds
  add_link_options(-fsanitize=${LOONGFORGE_SANITIZE})
endif()

if(LOONGFORGE_FUZZ)
  enable_testing()  # fuzz/: the <target>.replay tests, also when LOONGFORGE_TESTS is OFF
endif()
