"""Reads attncheck's repro bundles through the HDF5 library attncheck itself is linked with (ctypes),
so that ``repro --export pytest`` needs no h5py: a GPU host with torch and pytest but no h5py
exports as well (docs/bridge.md "Exporting a finding").

Only what bundles hold is read (harness/core/hdf5io.cpp writes them): groups, numeric datasets
(contiguous or chunked + shuffle + gzip, decoded by libhdf5) and scalar attributes (UTF-8
variable-length strings, int64, double). Every failure raises ``Hdf5Error`` naming the file and
the object.

Which libhdf5: ATTNCHECK_HDF5_LIB when set; else the one mapped into the parent process (the
attncheck binary that started the exporter); else the interpreter's search (libhdf5_serial,
libhdf5).
"""

import ctypes
import ctypes.util
import os

import numpy as np

_H5T_INTEGER, _H5T_FLOAT, _H5T_STRING = 0, 1, 3
_H5T_SGN_NONE = 0
_H5T_VARIABLE = ctypes.c_size_t(-1).value
_H5T_CSET_UTF8 = 1


class Hdf5Error(Exception):
    pass


def _library_path():
    env = os.environ.get("ATTNCHECK_HDF5_LIB")
    if env:
        return env
    try:
        with open(f"/proc/{os.getppid()}/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = os.path.basename(path)
                if name.startswith(("libhdf5.so", "libhdf5_serial.so")):
                    return path
    except OSError:
        pass
    for name in ("hdf5_serial", "hdf5"):
        found = ctypes.util.find_library(name)
        if found:
            return found
    raise Hdf5Error("no HDF5 library found (set ATTNCHECK_HDF5_LIB to libhdf5.so)")


_lib = {}


def _h5():
    if "lib" in _lib:
        return _lib["lib"]
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise Hdf5Error(f"cannot load {path}: {e}") from e
    i64, cp, sz = ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t
    sigs = {
        "H5open": ([], ctypes.c_int), "H5Eset_auto2": ([i64, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
        "H5get_libversion": ([ctypes.POINTER(ctypes.c_uint)] * 3, ctypes.c_int),
        "H5Fopen": ([cp, ctypes.c_uint, i64], i64), "H5Fclose": ([i64], ctypes.c_int),
        "H5Gopen2": ([i64, cp, i64], i64), "H5Gclose": ([i64], ctypes.c_int),
        "H5Gget_info": ([i64, ctypes.c_void_p], ctypes.c_int),
        "H5Lget_name_by_idx": ([i64, cp, ctypes.c_int, ctypes.c_int, ctypes.c_uint64, cp, sz, i64], ctypes.c_ssize_t),
        "H5Dopen2": ([i64, cp, i64], i64), "H5Dclose": ([i64], ctypes.c_int),
        "H5Dget_space": ([i64], i64), "H5Dget_type": ([i64], i64),
        "H5Dread": ([i64, i64, i64, i64, i64, ctypes.c_void_p], ctypes.c_int),
        "H5Sget_simple_extent_ndims": ([i64], ctypes.c_int),
        "H5Sget_simple_extent_dims": ([i64, ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p], ctypes.c_int),
        "H5Sclose": ([i64], ctypes.c_int),
        "H5Tget_class": ([i64], ctypes.c_int), "H5Tget_size": ([i64], sz), "H5Tget_sign": ([i64], ctypes.c_int),
        "H5Tget_native_type": ([i64, ctypes.c_int], i64), "H5Tis_variable_str": ([i64], ctypes.c_int),
        "H5Tcopy": ([i64], i64), "H5Tset_size": ([i64, sz], ctypes.c_int),
        "H5Tset_cset": ([i64, ctypes.c_int], ctypes.c_int), "H5Tclose": ([i64], ctypes.c_int),
        "H5Aexists_by_name": ([i64, cp, cp, i64], ctypes.c_int),
        "H5Aopen_by_name": ([i64, cp, cp, i64, i64], i64), "H5Aclose": ([i64], ctypes.c_int),
        "H5Aget_type": ([i64], i64), "H5Aread": ([i64, i64, ctypes.c_void_p], ctypes.c_int),
        "H5free_memory": ([ctypes.c_void_p], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    lib.H5open()
    v = [ctypes.c_uint() for _ in range(3)]
    lib.H5get_libversion(*(ctypes.byref(x) for x in v))
    if (v[0].value, v[1].value) < (1, 10):
        raise Hdf5Error(f"{path} is HDF5 {v[0].value}.{v[1].value}: 1.10 or newer is needed (64-bit ids)")
    lib.H5Eset_auto2(0, None, None)  # errors become return codes, reported here with the object
    _lib["lib"] = lib
    return lib


def _global_id(lib, name):
    return ctypes.c_int64.in_dll(lib, name).value


class _GroupInfo(ctypes.Structure):
    _fields_ = [("storage_type", ctypes.c_int), ("nlinks", ctypes.c_uint64),
                ("max_corder", ctypes.c_int64), ("mounted", ctypes.c_bool)]


class Node:
    """A group or dataset of an open bundle: ``attr(name)``, ``names()`` (a group's members),
    ``read()`` (a dataset's contents as a NumPy array)."""

    def __init__(self, file, path):
        self._file, self.path = file, path

    def _check(self, value, what):
        if value < 0:
            raise Hdf5Error(f"{self._file.name}: {self.path}: {what} failed")
        return value

    def has_attr(self, name):
        lib = _h5()
        return self._check(lib.H5Aexists_by_name(self._file.fid, self.path.encode(), name.encode(), 0),
                           f"looking up attribute '{name}'") > 0

    def attr(self, name):
        lib = _h5()
        a = self._check(lib.H5Aopen_by_name(self._file.fid, self.path.encode(), name.encode(), 0, 0),
                        f"opening attribute '{name}'")
        try:
            t = self._check(lib.H5Aget_type(a), f"attribute '{name}' type")
            try:
                return self._read_attr(lib, a, t, name)
            finally:
                lib.H5Tclose(t)
        finally:
            lib.H5Aclose(a)

    def _read_attr(self, lib, a, t, name):
        cls = lib.H5Tget_class(t)
        if cls == _H5T_STRING:
            if lib.H5Tis_variable_str(t) > 0:
                mem = lib.H5Tcopy(_global_id(lib, "H5T_C_S1_g"))
                lib.H5Tset_size(mem, _H5T_VARIABLE)
                lib.H5Tset_cset(mem, _H5T_CSET_UTF8)
                p = ctypes.c_void_p()
                try:
                    self._check(lib.H5Aread(a, mem, ctypes.byref(p)), f"reading attribute '{name}'")
                finally:
                    lib.H5Tclose(mem)
                text = ctypes.string_at(p.value).decode() if p.value else ""
                if p.value:
                    lib.H5free_memory(p)
                return text
            buf = ctypes.create_string_buffer(lib.H5Tget_size(t))
            self._check(lib.H5Aread(a, t, buf), f"reading attribute '{name}'")
            return buf.raw.split(b"\0", 1)[0].decode()
        if cls in (_H5T_INTEGER, _H5T_FLOAT):
            native, value = (("H5T_NATIVE_LLONG_g", ctypes.c_int64()) if cls == _H5T_INTEGER
                             else ("H5T_NATIVE_DOUBLE_g", ctypes.c_double()))
            self._check(lib.H5Aread(a, _global_id(lib, native), ctypes.byref(value)), f"reading attribute '{name}'")
            return value.value
        raise Hdf5Error(f"{self._file.name}: {self.path}: attribute '{name}' has an unexpected type class {cls}")

    def names(self):
        lib = _h5()
        g = self._check(lib.H5Gopen2(self._file.fid, self.path.encode(), 0), "opening the group")
        try:
            info = _GroupInfo()
            self._check(lib.H5Gget_info(g, ctypes.byref(info)), "reading the group")
            out = []
            for i in range(info.nlinks):
                n = self._check(lib.H5Lget_name_by_idx(g, b".", 0, 0, i, None, 0, 0), "reading a member name")
                buf = ctypes.create_string_buffer(n + 1)
                lib.H5Lget_name_by_idx(g, b".", 0, 0, i, buf, n + 1, 0)
                out.append(buf.value.decode())
            return out
        finally:
            lib.H5Gclose(g)

    def child(self, name):
        return Node(self._file, self.path.rstrip("/") + "/" + name)

    def read(self):
        lib = _h5()
        d = self._check(lib.H5Dopen2(self._file.fid, self.path.encode(), 0), "opening the dataset")
        try:
            space = self._check(lib.H5Dget_space(d), "reading the dataspace")
            try:
                nd = self._check(lib.H5Sget_simple_extent_ndims(space), "reading the rank")
                dims = (ctypes.c_uint64 * max(nd, 1))()
                self._check(lib.H5Sget_simple_extent_dims(space, dims, None), "reading the dims")
            finally:
                lib.H5Sclose(space)
            shape = tuple(int(dims[i]) for i in range(nd))
            t = self._check(lib.H5Dget_type(d), "reading the datatype")
            try:
                dtype = self._numpy_type(lib, t)
                mem = self._check(lib.H5Tget_native_type(t, 0), "the native type")
            finally:
                lib.H5Tclose(t)
            out = np.empty(shape, dtype=dtype)
            try:
                if out.size:
                    self._check(lib.H5Dread(d, mem, 0, 0, 0, out.ctypes.data_as(ctypes.c_void_p)), "reading the data")
            finally:
                lib.H5Tclose(mem)
            return out
        finally:
            lib.H5Dclose(d)

    def _numpy_type(self, lib, t):
        cls, size = lib.H5Tget_class(t), lib.H5Tget_size(t)
        if cls == _H5T_FLOAT and size in (4, 8, 2):
            return np.dtype(f"<f{size}")
        if cls == _H5T_INTEGER and size in (1, 2, 4, 8):
            return np.dtype(("<u" if lib.H5Tget_sign(t) == _H5T_SGN_NONE else "<i") + str(size))
        raise Hdf5Error(f"{self._file.name}: {self.path}: datatype class {cls} size {size} is not numeric")


class File(Node):
    """An HDF5 file opened read-only; the root group."""

    def __init__(self, name):
        lib = _h5()
        self.name = os.fspath(name)
        self.fid = lib.H5Fopen(self.name.encode(), 0, 0)  # H5F_ACC_RDONLY, H5P_DEFAULT
        if self.fid < 0:
            raise Hdf5Error(f"{self.name}: not a readable HDF5 file")
        super().__init__(self, "/")

    def close(self):
        if self.fid >= 0:
            _h5().H5Fclose(self.fid)
            self.fid = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
