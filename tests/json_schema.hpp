#pragma once
// The subset of JSON Schema that docs/schemas/ uses (type, properties, required, items), checked
// against a document: the schemas pin the keys a command's --json output has, so that a key that
// disappears, is renamed or changes type fails a test (additions are allowed: a schema's objects
// do not close their properties).
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace shardplan::test {

/// The type names of JSON Schema; "number" accepts integers too.
inline bool json_has_type(const nlohmann::json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer() || v.is_number_unsigned();
  if (type == "string") return v.is_string();
  if (type == "array") return v.is_array();
  if (type == "object") return v.is_object();
  return false;
}

/// Every way `v` (at `path`, "/" for the root) fails `schema`, one line each naming the path.
inline void json_schema_errors(const nlohmann::json& schema, const nlohmann::json& v,
                               const std::string& path, std::vector<std::string>& errors) {
  if (const auto t = schema.find("type"); t != schema.end()) {
    std::vector<std::string> types;
    if (t->is_array()) {
      for (const auto& x : *t) types.push_back(x.get<std::string>());
    } else {
      types.push_back(t->get<std::string>());
    }
    bool any = false;
    for (const auto& type : types) any = any || json_has_type(v, type);
    if (!any) {
      errors.push_back(path + ": expected " + t->dump() + ", got " + v.type_name());
      return;
    }
  }
  if (v.is_object()) {
    if (const auto req = schema.find("required"); req != schema.end()) {
      for (const auto& key : *req) {
        if (!v.contains(key.get<std::string>())) {
          errors.push_back(path + ": the key '" + key.get<std::string>() + "' is missing");
        }
      }
    }
    if (const auto props = schema.find("properties"); props != schema.end()) {
      for (const auto& [key, sub] : props->items()) {
        if (v.contains(key)) json_schema_errors(sub, v.at(key), path + key + "/", errors);
      }
    }
  }
  if (v.is_array()) {
    if (const auto items = schema.find("items"); items != schema.end()) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        json_schema_errors(*items, v[i], path + std::to_string(i) + "/", errors);
      }
    }
  }
}

inline std::vector<std::string> json_schema_errors(const nlohmann::json& schema,
                                                   const nlohmann::json& v) {
  std::vector<std::string> errors;
  json_schema_errors(schema, v, "/", errors);
  return errors;
}

}  // namespace shardplan::test
