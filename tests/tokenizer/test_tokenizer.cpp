#include <gtest/gtest.h>
#include "tokenizer/tokenizer.h"
TEST(Placeholder, Builds) { SUCCEED(); }
