# Cross-compiling for 64-bit ARM Linux on a Debian x86-64 host: g++-aarch64-linux-gnu and the arm64
# builds of the libraries (Debian multiarch, `dpkg --add-architecture arm64`). scripts/arm64.sh uses it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Headers and libraries from the target's multiarch folders; programs from the host.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# pkg-config: only the arm64 .pc files (header-only packages' .pc files are in /usr/share/pkgconfig).
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
# Tests run under qemu-aarch64 (Debian qemu-user) with multiarch's loader and libraries (libc6:arm64,
# which the arm64 libraries pull in): the loader and libc must come from one glibc build
# (scripts/arm64.sh says why).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
