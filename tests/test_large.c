/* PLACEHOLDER: being written (issue 5); replaced before this branch merges. */
#define HARNESS_MAIN
#include "harness.h"
