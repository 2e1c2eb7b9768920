#pragma once
// The program layer's IR (private): a traced program is a Graph of Nodes in topological order,
// each applying a Primitive (primitive.hpp) to earlier values, with the primitive's attributes.
// Users never see it: ops record into it, sjit compiles it (compile.hpp), autodiff replays it.

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "fields.hpp"
#include "shardplan/dtype.hpp"
#include "shardplan/error.hpp"
#include "shardplan/program_cost.hpp"
#include "shardplan/shape.hpp"

namespace shardplan::detail {

struct Primitive;

/// Shape and dtype of a value.
struct TensorType {
  Shape shape;
  DType dtype = DType::kF32;
  friend bool operator==(const TensorType&, const TensorType&) = default;
};
/// "f32[8, 16]".
std::string to_string(const TensorType& t);

/// A value of a graph: the index of the node that computes it.
enum class ValueId : std::int32_t {};
constexpr std::size_t index(ValueId v) { return static_cast<std::size_t>(v); }
constexpr ValueId value_id(std::size_t i) { return static_cast<ValueId>(i); }
/// "%12".
std::string value_name(ValueId v);

/// Something per value of a graph, indexed by ValueId.
template <class T>
class ValueMap {
 public:
  ValueMap() = default;
  explicit ValueMap(std::size_t n, const T& init = T()) : v_(n, init) {}
  typename std::vector<T>::reference operator[](ValueId id) { return v_[index(id)]; }
  typename std::vector<T>::const_reference operator[](ValueId id) const { return v_[index(id)]; }
  std::size_t size() const { return v_.size(); }
  void push_back(T x) { v_.push_back(std::move(x)); }
  void reserve(std::size_t n) { v_.reserve(n); }

 private:
  std::vector<T> v_;
};

/// A primitive's attributes: any aggregate (its own struct, defined with the primitive), held by
/// value. Equality and hashing are derived from its fields (fields.hpp); its text comes from a
/// `format_attrs(const T&)` found next to it (" axes=[0,1]"; empty for none).
class Attrs {
 public:
  Attrs() = default;
  template <class T>
  requires(!std::is_same_v<std::remove_cvref_t<T>, Attrs>)
      Attrs(T value)  // NOLINT: attributes convert implicitly, as in Node{.attrs = Reduce{...}}
      : p_(std::make_shared<const Model<std::remove_cvref_t<T>>>(std::move(value))) {}

  bool empty() const { return p_ == nullptr; }
  /// The attributes as T. Throws Error when they are of another type (a primitive's definition
  /// and its nodes disagree: a bug here, not a user error).
  template <class T>
  const T& get() const {
    const auto* m = dynamic_cast<const Model<T>*>(p_.get());
    if (m == nullptr) {
      throw Error(std::string("[graph] attributes are not ") + typeid(T).name());
    }
    return m->value;
  }
  friend bool operator==(const Attrs& a, const Attrs& b) {
    if (a.p_ == b.p_) return true;
    return a.p_ && b.p_ && a.p_->equals(*b.p_);
  }
  std::size_t hash() const { return p_ ? p_->hash() : 0; }
  std::string to_string() const { return p_ ? p_->text() : std::string(); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual bool equals(const Base& other) const = 0;
    virtual std::size_t hash() const = 0;
    virtual std::string text() const = 0;
  };
  template <class T>
  struct Model final : Base {
    explicit Model(T v) : value(std::move(v)) {}
    bool equals(const Base& other) const override {
      const auto* o = dynamic_cast<const Model<T>*>(&other);
      return o != nullptr && same(value, o->value);
    }
    std::size_t hash() const override { return hash_combine(typeid(T).hash_code(), hash_of(value)); }
    std::string text() const override { return format_attrs(value); }
    T value;
  };
  std::shared_ptr<const Base> p_;
};

/// One operation of a graph: a primitive applied to earlier values.
struct Node {
  const Primitive* op = nullptr;
  std::vector<ValueId> operands;
  TensorType type;  // of the result (global; a kernel's node has its block's shape)
  Attrs attrs;
  /// The named scope open when it was recorded (shardplan::named_scope), or null: for people
  /// (the profiler's events), never read by a pass.
  std::shared_ptr<const std::string> scope;
  /// The library composite op that recorded it (CompositeScope: a `composite::` name, static
  /// text), or null; its backward ops carry it too. What Lowered::ops() reports.
  const char* composite = nullptr;

  bool is(const Primitive& p) const { return op == &p; }
  template <class T>
  const T& attr() const {
    return attrs.get<T>();
  }
};

/// A traced program: nodes in topological order (operands before users) and the outputs.
struct Graph {
  std::vector<Node> nodes;
  std::vector<ValueId> outputs;
  int num_inputs = 0;
  /// Where each phase begins (begin_phase): the number of nodes recorded before it, in order.
  std::vector<std::pair<std::size_t, StepPhase>> phase_marks;
  /// Names for people (checkpoint_name, kept through value_and_grad's replay): the memory
  /// timeline's labels. Never read by a pass.
  std::map<ValueId, std::vector<std::string>> names;

  ValueId add(Node n) {
    nodes.push_back(std::move(n));
    return value_id(nodes.size() - 1);
  }
  const Node& operator[](ValueId v) const { return nodes[index(v)]; }
  Node& operator[](ValueId v) { return nodes[index(v)]; }
  std::size_t size() const { return nodes.size(); }
  /// A jaxpr-like listing: "{ lambda %0:f32[8,16] %1:f32[16,4] . %2:f32[8,4] = dot_general ...
  std::string to_string() const;
};

/// The argument (an input node) `v` is, read through casts, barriers, sharding identities and
/// pointwise ops whose other operands are scalars or constants (a scaling: float8's casts):
/// what FSDP gathers when `v` is resharded (a weight as used), not a value the step computed.
/// None otherwise. The one definition the costs and the memory report share.
std::optional<ValueId> argument_read(const Graph& g, ValueId v);

}  // namespace shardplan::detail
