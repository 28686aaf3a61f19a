#include "relay/model/bpe_tokenizer.h"
#include <gtest/gtest.h>
