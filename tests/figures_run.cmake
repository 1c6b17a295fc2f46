# Runs a chapter's make_figures.sh into an emptied folder and checks what it left there, with
# gnuplot or without it:
#   cmake -DSCRIPT=<make_figures.sh> -DOUT=<folder> "-DARGS=<its other arguments>" -P figures_run.cmake
# The script must end with status 0 either way. Where gnuplot is on the PATH (looked up as the
# scripts and the programs look it up) it must draw: at least one plot, each with its machine
# stamp beside it, and no "not drawn". Where it is not, the script must say which plots it did
# not draw ("not drawn: ... gnuplot not found"), leave no plot and no stamp of a plot that is not
# there, and still write its logs and CSVs.
foreach(var SCRIPT OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "figures_run.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${OUT}")  # a plot left by an earlier run must not pass for this run's
# These runs test the scripts in whatever checkout is being tested, committed or not: allow
# uncommitted changes (the stamps then say so; tests/tools/figures_refuse_dirty_tree.sh checks
# that without this the scripts refuse).
set(ENV{MGPU_FIGURES_ALLOW_DIRTY} 1)
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${SCRIPT} --out ${OUT} ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(seen "exit status: ${status}\n--- stdout:\n${out}\n--- stderr:\n${err}")
# The output first, so that ctest's SKIP_REGULAR_EXPRESSION ("no GPU answers") can see it.
message("${seen}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "`${SCRIPT} --out ${OUT} ${ARGS}` should exit with status 0, got '${status}'")
endif()

execute_process(COMMAND sh -c "command -v gnuplot" RESULT_VARIABLE no_gnuplot OUTPUT_QUIET ERROR_QUIET)
file(GLOB plots "${OUT}/*.png")
file(GLOB csvs "${OUT}/*.csv" "${OUT}/*/*.csv")
if(NOT csvs)
  message(FATAL_ERROR "${OUT}: no CSV was written")
endif()
if(no_gnuplot EQUAL 0)
  if("${out}${err}" MATCHES "not drawn: ")
    message(FATAL_ERROR "gnuplot is installed, yet the script says a plot was not drawn")
  endif()
  if(NOT plots)
    message(FATAL_ERROR "gnuplot is installed, yet ${OUT} holds no plot")
  endif()
  foreach(plot IN LISTS plots)
    string(REGEX REPLACE "\\.png$" ".stamp.txt" stamp "${plot}")
    if(NOT EXISTS "${stamp}")
      message(FATAL_ERROR "${plot} has no machine stamp beside it")
    endif()
  endforeach()
else()
  if(NOT "${out}${err}" MATCHES "not drawn: [^\n]+ \\(gnuplot not found")
    message(FATAL_ERROR "gnuplot is not installed, yet the script does not say which plots it did not draw")
  endif()
  if(plots)
    message(FATAL_ERROR "gnuplot is not installed, yet ${OUT} holds plots: ${plots}")
  endif()
  # A stamp says what a plot or a table (NAME.md) was measured on: never stands alone.
  file(GLOB stamps "${OUT}/*.stamp.txt")
  foreach(stamp IN LISTS stamps)
    string(REGEX REPLACE "\\.stamp\\.txt$" "" name "${stamp}")
    if(NOT EXISTS "${name}.md")
      message(FATAL_ERROR "${stamp} stamps a plot that was not drawn")
    endif()
  endforeach()
endif()
