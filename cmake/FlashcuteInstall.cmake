# Installs libflashcute, its public header and a CMake package: find_package(flashcute)
# gives the imported target flashcute::flashcute.
include(CMakePackageConfigHelpers)

install(TARGETS flashcute EXPORT flashcuteTargets
  LIBRARY DESTINATION ${FLASHCUTE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${FLASHCUTE_INSTALL_LIBDIR})
install(FILES cpp/include/flashcute/flashcute.h DESTINATION ${FLASHCUTE_INSTALL_INCLUDEDIR}/flashcute)
install(EXPORT flashcuteTargets NAMESPACE flashcute:: DESTINATION ${FLASHCUTE_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/flashcuteConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flashcuteConfig.cmake
  INSTALL_DESTINATION ${FLASHCUTE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashcuteConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashcuteConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flashcuteConfigVersion.cmake
        DESTINATION ${FLASHCUTE_INSTALL_CMAKEDIR})
