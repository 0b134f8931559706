# FLASHCUTE_VERSION: the package version, written once, as [project] version in pyproject.toml.
# scikit-build-core passes it as SKBUILD_PROJECT_VERSION; a plain CMake configure reads the file.
if(DEFINED SKBUILD_PROJECT_VERSION)
  set(FLASHCUTE_VERSION "${SKBUILD_PROJECT_VERSION}")
else()
  file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/../pyproject.toml" _fc_version_line
       REGEX "^version *= *\"" LIMIT_COUNT 1)
  if(NOT _fc_version_line MATCHES "\"([0-9]+(\\.[0-9]+)*)")
    message(FATAL_ERROR "flashcute: pyproject.toml has no version = \"X.Y.Z\" line")
  endif()
  set(FLASHCUTE_VERSION "${CMAKE_MATCH_1}")
endif()
