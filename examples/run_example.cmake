# Runs one example for its test: it passes when the program exits with 0 and its output matches
# EXPECT (a CMake regular expression). CTest's PASS_REGULAR_EXPRESSION alone would ignore the
# exit status, so a crash after the last line printed would pass.
#   cmake -DPROGRAM=<executable> -DEXPECT=<regex> -P run_example.cmake
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE errors)
message("${output}${errors}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${status}")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM}: output does not match \"${EXPECT}\"")
endif()
