# kiln_warnings(target): warnings are errors on our own code (generated code is
# compiled without them).
function(kiln_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter
      -Wno-missing-field-initializers -Wno-sign-compare
      # GCC 12 at -O3 reports false -Wrestrict hits inside std::string (GCC bug 105329).
      $<$<CXX_COMPILER_ID:GNU>:-Wno-restrict>>)
endfunction()

# kiln_test(name SOURCES ... LIBS ... [LABELS ...]): one gtest binary, one ctest
# entry with the given labels.
function(kiln_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock kiln_test_main)
  kiln_warnings(${name})
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR};KILN_BUILD_DIR=${PROJECT_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
