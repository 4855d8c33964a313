// tailcut/export.h: symbol visibility. The library is built with hidden
// visibility; public classes and functions carry TAILCUT_EXPORT.
#ifndef TAILCUT_EXPORT_H_
#define TAILCUT_EXPORT_H_

#define TAILCUT_EXPORT __attribute__((visibility("default")))

#endif  // TAILCUT_EXPORT_H_
