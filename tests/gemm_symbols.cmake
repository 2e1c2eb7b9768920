# Checks that a GEMM variant's object file (src/runtime/gemm/variant.cpp built for one instruction
# set) defines no external symbol without the variant's own name in it: a weak Eigen or standard
# library instantiation compiled with AVX2 but named as the plain build names it could be chosen by
# the linker for the whole program, and fault on a CPU without AVX2.
# Usage: cmake -DNM=nm -DISA=avx2 -DOBJECTS=variant.o -P gemm_symbols.cmake
execute_process(COMMAND ${NM} -C --defined-only --extern-only ${OBJECTS}
                OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${OBJECTS}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(own 0)
set(foreign "")
foreach(line IN LISTS lines)
  # DW.ref.__gxx_personality_v0: a pointer to the C++ exception personality routine (data, the
  # same in every object file), not code.
  if(line STREQUAL "" OR line MATCHES ":$" OR line MATCHES " DW\\.ref\\.__gxx_personality_v0$")
    continue()
  endif()
  if(line MATCHES "shardplan_eigen_${ISA}|gemm_${ISA}\\(")
    math(EXPR own "${own} + 1")
  else()
    string(APPEND foreign "\n  ${line}")
  endif()
endforeach()
if(foreign)
  message(FATAL_ERROR "the ${ISA} GEMM variant defines symbols another object file may define:${foreign}")
endif()
if(own EQUAL 0)
  message(FATAL_ERROR "the ${ISA} GEMM variant defines none of its own symbols: wrong object file?")
endif()
message(STATUS "${ISA}: ${own} external symbols, each named for the variant")
