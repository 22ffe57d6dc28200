// Table: rows of strings printed as aligned columns, for stratactl's human
// output. Not thread-safe.
#ifndef STRATA_TOOLS_TABLE_H_
#define STRATA_TOOLS_TABLE_H_

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace strata {

class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void Print(FILE* out) const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_) {
      for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
        width[i] = std::max(width[i], row[i].size());
      }
    }
    for (const auto& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
      }
      std::fprintf(out, "%s\n", line.c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace strata

#endif  // STRATA_TOOLS_TABLE_H_
