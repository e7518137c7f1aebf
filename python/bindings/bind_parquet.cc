// Python binding of the Parquet reader (src/dataset/parquet/parquet.h), for tests and inspection:
//   _C.read_parquet(path, columns=[]) -> {name: column}
// A flat column is a numpy array (int64, float64, bool) or a list of str/bytes; a list column is a
// list (one entry per row) of those. Nulls are None (numpy columns with nulls become object
// arrays). Errors arrive as the Status translation in bindings.h says (DataLoss ->
// loongforge.DataLossError, NotFound -> FileNotFoundError, Unimplemented -> RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "dataset/parquet/parquet.h"

namespace loongforge::data::parquet {
namespace {

// Value i of c as a Python object (None when null).
py::object Value(const Column& c, size_t i) {
  if (!c.valid.empty() && !c.valid[i]) return py::none();
  switch (c.kind) {
    case Column::Kind::kInt64:
      return py::int_(c.i64[i]);
    case Column::Kind::kDouble:
      return py::float_(c.f64[i]);
    case Column::Kind::kBool:
      return py::bool_(c.b[i] != 0);
    case Column::Kind::kString: {
      // UTF-8 text comes back as str; other bytes (BYTE_ARRAY without UTF8) as bytes.
      PyObject* s =
          PyUnicode_DecodeUTF8(c.str[i].data(), static_cast<Py_ssize_t>(c.str[i].size()), "strict");
      if (s != nullptr) return py::reinterpret_steal<py::object>(s);
      PyErr_Clear();
      return py::bytes(c.str[i]);
    }
  }
  return py::none();
}

// Values [begin, end) of c as a numpy array when all valid and numeric, else a list.
py::object Slice(const Column& c, size_t begin, size_t end) {
  bool all_valid = true;
  for (size_t i = begin; !c.valid.empty() && all_valid && i < end; ++i) all_valid = c.valid[i];
  if (all_valid) {
    const auto n = static_cast<py::ssize_t>(end - begin);
    switch (c.kind) {
      case Column::Kind::kInt64:
        return py::array_t<int64_t>(n, c.i64.data() + begin);
      case Column::Kind::kDouble:
        return py::array_t<double>(n, c.f64.data() + begin);
      case Column::Kind::kBool: {
        py::array_t<bool> a(n);
        for (py::ssize_t i = 0; i < n; ++i) a.mutable_at(i) = c.b[begin + i] != 0;
        return a;
      }
      case Column::Kind::kString:
        break;
    }
  }
  py::list l;
  for (size_t i = begin; i < end; ++i) l.append(Value(c, i));
  return l;
}

void RegisterParquet(py::module_& m) {
  m.def(
      "read_parquet",
      [](const std::string& path, const std::vector<std::string>& columns) {
        std::vector<Column> cols =
            ValueOrThrowWithoutGil([&] { return ReadParquet(path, columns); });
        py::dict d;
        for (const Column& c : cols) {
          if (!c.is_list) {
            d[py::str(c.name)] = Slice(c, 0, c.NumValues());
            continue;
          }
          py::list rows;
          for (size_t row = 0; row + 1 < c.offsets.size(); ++row) {
            rows.append(Slice(c, static_cast<size_t>(c.offsets[row]),
                              static_cast<size_t>(c.offsets[row + 1])));
          }
          d[py::str(c.name)] = rows;
        }
        return d;
      },
      py::arg("path"), py::arg("columns") = std::vector<std::string>{},
      "Reads Parquet columns (all when empty) with LoongForge's reader: {name: numpy array or "
      "list}.");
  m.def(
      "parquet_num_rows",
      [](const std::string& path) { return ValueOrThrow(ParquetNumRows(path)); }, py::arg("path"));
  m.def(
      "parquet_column_names",
      [](const std::string& path) { return ValueOrThrow(ParquetColumnNames(path)); },
      py::arg("path"));
}

}  // namespace

LF_REGISTER_BINDINGS(parquet, RegisterParquet);

}  // namespace loongforge::data::parquet
