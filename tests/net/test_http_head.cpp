// The socket-free rules of a request's head (net/http_head.h) and the file-limit arithmetic.
#include <gtest/gtest.h>

#include "net/http.h"
#include "net/http_head.h"

namespace {

using namespace tern::net;

TEST(HttpHead, OnlyChunkedTransferCodingIsRead) {
  EXPECT_TRUE(transfer_coding_supported(""));
  EXPECT_TRUE(transfer_coding_supported("chunked"));
  EXPECT_TRUE(transfer_coding_supported(" Chunked "));
  for (const char* te : {"gzip", "identity", "gzip, chunked", "chunked, gzip", "chunked,chunked", "chunkedx", ","})
    EXPECT_FALSE(transfer_coding_supported(te)) << te;
}

TEST(HttpHead, AbsoluteFormTargetsAreReducedToTheirPathAndQuery) {
  EXPECT_EQ(origin_form("/v1/models?x=1"), "/v1/models?x=1");
  EXPECT_EQ(origin_form("http://127.0.0.1:8000/v1/models"), "/v1/models");
  EXPECT_EQ(origin_form("HTTP://example.com/v1/models?x=1"), "/v1/models?x=1");
  EXPECT_EQ(origin_form("https://example.com"), "/");
  EXPECT_EQ(origin_form("http://example.com?q"), "/?q");
  EXPECT_EQ(origin_form("*"), "*");
  EXPECT_EQ(origin_form("ftp://example.com/x"), "ftp://example.com/x");  // not ours: 404 as it is
}

TEST(FileLimit, ConnectionsStayBelowTheFileLimit) {
  FileLimit f;
  f.soft = 1024;
  EXPECT_EQ(connections_within(f, 4096, 1), 960u);
  EXPECT_EQ(connections_within(f, 4096, 3), 320u);
  EXPECT_EQ(connections_within(f, 100, 1), 100u);
  f.soft = 100;  // tiny limits keep half for everything else
  EXPECT_EQ(connections_within(f, 4096, 1), 50u);
  f.soft = 0;  // unknown
  EXPECT_EQ(connections_within(f, 4096, 1), 4096u);
}

}  // namespace
