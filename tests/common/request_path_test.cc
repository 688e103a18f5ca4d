#include "common/request_path.h"

#include <gtest/gtest.h>

#include <string>

namespace idemgate {
namespace {

std::string Normal(std::string_view path, bool merge_slashes = true) {
  std::string out;
  NormalizePath(path, merge_slashes, out);
  return out;
}

TEST(RequestPath, DecodesEncodedUnreservedCharactersInEitherCase) {
  EXPECT_EQ(Normal("/api/v1/%70ayments"), "/api/v1/payments");
  EXPECT_EQ(Normal("/%41%5a%61%7A%30%39%2D%2E%5F%7E"), "/AZaz09-._~");
  EXPECT_EQ(Normal("/%7e%7E"), "/~~");
  EXPECT_TRUE(PathNeedsNormalizing("/api/v1/%70ayments", false));
}

TEST(RequestPath, LeavesOtherEscapesAndBrokenOnesAsTheyAre) {
  // Reserved, control, space, non-ASCII and the escape of '%' itself keep
  // their meaning only while encoded; "%2570" must not become "%70" or "p".
  for (const char* kept : {"/a%2Fb", "/a%2fb", "/a%20b", "/a%00b", "/a%3Fb", "/a%25", "/a%2570", "/a%C3%A9",
                           "/a%", "/a%7", "/a%G0", "/a%0G", "/plain", "/", "/a/b/"}) {
    EXPECT_FALSE(PathNeedsNormalizing(kept, true)) << kept;
    EXPECT_EQ(Normal(kept), kept);
  }
}

TEST(RequestPath, MergesRunsOfSlashesOnlyWhenAsked) {
  EXPECT_EQ(Normal("//api///v1//payments//"), "/api/v1/payments/");
  EXPECT_TRUE(PathNeedsNormalizing("//api", true));
  EXPECT_TRUE(PathNeedsNormalizing("/api//", true));
  EXPECT_FALSE(PathNeedsNormalizing("//api///v1", false));
  EXPECT_EQ(Normal("//api///v1", false), "//api///v1");
  // A decoded character never joins a run of slashes: %2F stays encoded.
  EXPECT_EQ(Normal("/a/%2F/b"), "/a/%2F/b");
  EXPECT_EQ(Normal("/%7e//x"), "/~/x");
}

TEST(RequestPath, AppendsToWhatIsThere) {
  std::string out = "prefix/";
  NormalizePath("//a%62", true, out);
  EXPECT_EQ(out, "prefix//ab");
}

// Agrees with its own check: a path needs normalising exactly when the
// normalised form differs, for every short path over a confusable alphabet.
TEST(RequestPath, NeedsNormalizingIffTheFormChanges) {
  const std::string alphabet = "/%27aF~";
  std::string path(4, ' ');
  for (std::size_t n = 0; n < alphabet.size() * alphabet.size() * alphabet.size() * alphabet.size(); ++n) {
    std::size_t k = n;
    for (char& c : path) {
      c = alphabet[k % alphabet.size()];
      k /= alphabet.size();
    }
    for (const bool merge : {true, false}) {
      std::string out;
      NormalizePath(path, merge, out);
      EXPECT_EQ(PathNeedsNormalizing(path, merge), out != path) << path << " merge=" << merge;
    }
  }
}

}  // namespace
}  // namespace idemgate
