// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: a minimal JSON-lines writer (one flat object per line).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fusedstep::bench {

// One flat JSON object, built field by field in insertion order.
class JsonObject {
 public:
  JsonObject& add(const char* key, const std::string& value) {
    begin(key);
    text_ += '"';
    for (char c : value) {
      switch (c) {
        case '"': text_ += "\\\""; break;
        case '\\': text_ += "\\\\"; break;
        case '\n': text_ += "\\n"; break;
        case '\t': text_ += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            text_ += buf;
          } else {
            text_ += c;
          }
      }
    }
    text_ += '"';
    return *this;
  }
  JsonObject& add(const char* key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const char* key, int64_t value) {
    begin(key);
    text_ += std::to_string(value);
    return *this;
  }
  JsonObject& add(const char* key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonObject& add(const char* key, bool value) {
    begin(key);
    text_ += value ? "true" : "false";
    return *this;
  }
  // Non-finite numbers have no JSON spelling: they become null.
  JsonObject& add(const char* key, double value) {
    begin(key);
    if (!std::isfinite(value)) {
      text_ += "null";
    } else {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.6g", value);
      text_ += buf;
    }
    return *this;
  }
  JsonObject& add_null(const char* key) {
    begin(key);
    text_ += "null";
    return *this;
  }
  std::string str() const { return text_ + "}"; }

 private:
  void begin(const char* key) {
    text_ += text_.size() > 1 ? ", \"" : "\"";
    text_ += key;
    text_ += "\": ";
  }
  std::string text_ = "{";
};

// Appends one object per line to a file; flushed per line so a crash keeps the rows
// measured so far.
class JsonLines {
 public:
  bool open(const std::string& path) {
    file_ = std::fopen(path.c_str(), "w");
    return file_ != nullptr;
  }
  ~JsonLines() {
    if (file_) std::fclose(file_);
  }
  void write(const JsonObject& object) {
    if (!file_) return;
    std::fprintf(file_, "%s\n", object.str().c_str());
    std::fflush(file_);
  }

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace fusedstep::bench
