// tailcut/version.h: the version of the tailcut these headers belong to, e.g.
// for `#if TAILCUT_VERSION_MAJOR > 0 || TAILCUT_VERSION_MINOR >= 2`. The
// project version in CMakeLists.txt must say the same: configuring checks it.
#ifndef TAILCUT_VERSION_H_
#define TAILCUT_VERSION_H_

#define TAILCUT_VERSION_MAJOR 0
#define TAILCUT_VERSION_MINOR 1
#define TAILCUT_VERSION_PATCH 0
#define TAILCUT_VERSION_STRING "0.1.0"

#endif  // TAILCUT_VERSION_H_
