# Host dependencies (Debian 12: liblmdb-dev libturbojpeg0-dev libxxhash-dev libzstd-dev).
find_package(Threads REQUIRED)

find_path(LMDB_INCLUDE_DIR lmdb.h REQUIRED)
find_library(LMDB_LIBRARY lmdb REQUIRED)
find_path(TURBOJPEG_INCLUDE_DIR turbojpeg.h REQUIRED)
find_library(TURBOJPEG_LIBRARY turbojpeg REQUIRED)
find_path(JPEG_INCLUDE_DIR jpeglib.h REQUIRED)
find_library(JPEG_LIBRARY jpeg REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
find_path(ZSTD_INCLUDE_DIR zstd.h REQUIRED)
find_library(ZSTD_LIBRARY zstd REQUIRED)

add_library(lf_deps INTERFACE)
target_include_directories(lf_deps INTERFACE ${LMDB_INCLUDE_DIR} ${TURBOJPEG_INCLUDE_DIR}
                           ${JPEG_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR} ${ZSTD_INCLUDE_DIR})
target_link_libraries(lf_deps INTERFACE ${LMDB_LIBRARY} ${TURBOJPEG_LIBRARY} ${JPEG_LIBRARY}
                      ${XXHASH_LIBRARY} ${ZSTD_LIBRARY})
