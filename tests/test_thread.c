/* PLACEHOLDER: being written (issue 6); replaced before this branch merges. */
#define HARNESS_MAIN
#include "harness.h"
