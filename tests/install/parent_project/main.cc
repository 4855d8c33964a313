#include <tailcut/version.h>

#include <cstdio>

int main() { std::puts(TAILCUT_VERSION_STRING); }
