// Fields<P>::check (ops/typed_op.h), the one validator of axis values: unknown axes, a value's
// type, its allowed values and its bounds, judged in one place for case files, --params, the
// shrinker and make().
#include <gtest/gtest.h>

#include <string>

#include "ops/tests/registered_op.h"
#include "ops/typed_op.h"

namespace attncheck {
namespace {

enum class Shape { square, wide };

struct ProbeParams {
  int64_t count = 4;
  double scale = 0.5;
  bool flag = false;
  std::string note = "x";
  DType dtype = DType::f32;  // no only(): any dtype name
  Shape shape = Shape::square;
  int64_t small = 2;
};

Fields<ProbeParams> probe_fields() {
  using P = ProbeParams;
  return Fields<P>()
      .add("count", "c", &P::count, "a count")
      .bounds(1, 64)
      .add("scale", "sc", &P::scale, "a real")
      .add("flag", "f", &P::flag, "a boolean")
      .add("note", "", &P::note, "a text")
      .add("dtype", "", &P::dtype, "a dtype")
      .choice("shape", "", &P::shape, {{Shape::square, "square"}, {Shape::wide, "wide"}}, "")
      .add("small", "s", &P::small, "one of two")
      .only({1, 2});
}

std::string problem_of(const Params& given, bool* out_of_bounds = nullptr) {
  const auto p = probe_fields().check("probe", given);
  if (out_of_bounds) *out_of_bounds = p && p->out_of_bounds;
  return p ? p->what : "";
}

TEST(Fields, AcceptsEveryValueOfItsFields) {
  EXPECT_EQ(problem_of(Params::object()), "");
  EXPECT_EQ(problem_of({{"count", 64},
                        {"scale", 2},  // an integer is a real
                        {"flag", true},
                        {"note", "y"},
                        {"dtype", "bf16"},
                        {"shape", "wide"},
                        {"small", 1}}),
            "");
}

TEST(Fields, RejectsAnUnknownAxisNamingTheKnownOnes) {
  EXPECT_EQ(problem_of({{"cuont", 4}}),
            "unknown axis 'cuont' (known: count, scale, flag, note, dtype, shape, small)");
  EXPECT_EQ(problem_of(nlohmann::json::array()), "case parameters must be a table");
}

TEST(Fields, RejectsAValueOfTheWrongType) {
  EXPECT_EQ(problem_of({{"count", "4"}}), "axis 'count' expects a number, got \"4\"");
  EXPECT_EQ(problem_of({{"count", 1.5}}), "axis 'count' expects an integer, got 1.5");
  EXPECT_EQ(problem_of({{"flag", 1}}), "axis 'flag' expects a boolean, got 1");
  EXPECT_EQ(problem_of({{"note", 1}}), "axis 'note' expects a string, got 1");
}

TEST(Fields, RejectsAValueOutsideItsAllowedValues) {
  EXPECT_EQ(problem_of({{"small", 3}}), "axis 'small' value 3 is not one of 1, 2");
  EXPECT_EQ(problem_of({{"shape", "tall"}}),
            "axis 'shape' value \"tall\" is not one of \"square\", \"wide\"");
  // A dtype field without only() still takes dtype names alone (bind would not read another).
  EXPECT_EQ(problem_of({{"dtype", "fp9"}}), "axis 'dtype' value \"fp9\" is no dtype name");
}

TEST(Fields, ReportsBoundsLastAndMarksThem) {
  bool bounds = false;
  EXPECT_EQ(problem_of({{"count", 65}}, &bounds),
            "axis 'count' = 65 is outside op 'probe''s bounds [1, 64]");
  EXPECT_TRUE(bounds);
  // Any other problem comes first, wherever its axis is: without it the values name a case id.
  EXPECT_EQ(problem_of({{"count", 0}, {"small", 5}}, &bounds),
            "axis 'small' value 5 is not one of 1, 2");
  EXPECT_FALSE(bounds);
}

// The Op-level entry points all ask the same validator.
TEST(Fields, OpEntryPointsShareTheValidator) {
  const Op& op = registered_op("page_indices");
  EXPECT_TRUE(op.value_problem({{"blok", 1}}));
  try {
    (void)op.complete({{"blok", 1}});
    ADD_FAILURE() << "unknown axis accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("page_indices: unknown axis 'blok' (known: ", 0), 0u)
        << e.what();
  }
  // make() of a case whose values were never checked names the case, not a JSON type error.
  Case c = op.make_case(Params::object());
  c.params["block_size"] = 3;
  try {
    (void)op.make(c);
    ADD_FAILURE() << "unchecked value built";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind(c.id + ": axis 'block_size' value 3 is not one of ", 0),
              0u)
        << e.what();
  }
}

}  // namespace
}  // namespace attncheck
