#pragma once
// Helpers shared by the tests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

/// Expects `stmt` to throw `type` with a message containing every one of the strings.
#define EXPECT_THROW_WITH(stmt, type, ...)                                                   \
  do {                                                                                       \
    try {                                                                                    \
      stmt;                                                                                  \
      ADD_FAILURE() << "expected " #type " from: " #stmt;                                    \
    } catch (const type& e_) {                                                               \
      for (const std::string& part_ : {__VA_ARGS__}) {                                       \
        EXPECT_THAT(std::string(e_.what()), ::testing::HasSubstr(part_));                    \
      }                                                                                      \
    }                                                                                        \
  } while (0)
