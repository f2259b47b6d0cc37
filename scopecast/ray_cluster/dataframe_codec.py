"""How DataFrame rows travel as messages: which Spark schemas can (no maps, bounded nesting), the
Arrow schema a recorded Spark schema stands for, and the msgpack form of each value.

mode="rows": one msgpack map `{column: value}` per row, values in a msgpack-native form that the
recorded Spark schema turns back into the exact value: timestamps as integer microseconds since the
epoch (UTC), dates as days since the epoch, decimals as strings, binary as msgpack bin, structs as
maps, arrays as lists. mode="arrow": one Arrow IPC stream holding one record batch per message,
sliced to fit the maximum message size.

End of stream. Every publisher ends its stream on every topic of the run with one in-band *end
message*, a msgpack list `["scopecast.end", run, publisher, publishers, messages, rows, status]`,
then closes (flush until stable, then the runtime's own end-of-stream marker). The in-band
message is what collectors wait for: it is numbered, repaired and forwarded like any message, and
FIFO delivery puts it after everything the publisher sent before it. The runtime's marker is not
enough here: it is a single datagram, not repaired when lost, sent only along the publisher's own
channels and not forwarded (with the tree policy, subscribers below the first level never see it).
Other subscribers of these topics see the end messages too: lists, where rows are maps (rows mode)
or Arrow (arrow mode).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgpack

from scopecast.actors.errors import DataFrameRejected
from scopecast.netio.wire import ContentType

if TYPE_CHECKING:
    import pyarrow as pa


MAX_NESTING = 32            # levels of struct/array (msgpack-python packs at most 511)
MAX_PARALLELISM = 256
END_TAG = "scopecast.end"


# --------------------------------------------------------------------------- Spark schema checks

_ATOMIC = {"boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary",
           "date", "timestamp", "timestamp_ntz", "void", "null"}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)\Z")
CHAR_TYPES = re.compile(r"(var)?char\(\d+\)\Z")


def check_schema(schema: dict, max_nesting: int = MAX_NESTING) -> None:
    """Refuse (DataFrameRejected) a Spark schema (`df.schema.jsonValue()`) that topics cannot carry:
    a map anywhere, nesting deeper than `max_nesting` levels of struct/array, types without an Arrow
    form (intervals, user-defined types), duplicate field names."""
    _check_type(schema, "", 0, max_nesting)


def _check_type(t: Any, path: str, depth: int, max_nesting: int) -> None:
    where = f"column {path!r}" if path else "the DataFrame"
    if isinstance(t, str):
        if t in _ATOMIC or _DECIMAL.match(t) or CHAR_TYPES.match(t):
            return
        raise DataFrameRejected(f"{where} has type {t!r}, which topics cannot carry; cast it "
                                "(e.g. to string or long) before publishing")
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "map":
        raise DataFrameRejected(f"{where} is a map ({type_name(t)}): maps are not supported; turn it "
                                "into an array of structs first, e.g. with map_entries()")
    if kind not in ("struct", "array"):
        raise DataFrameRejected(f"{where} has type {type_name(t)}, which topics cannot carry")
    if path and depth + 1 > max_nesting:
        top = re.split(r"[.\[]", path, maxsplit=1)[0]
        raise DataFrameRejected(f"column {top!r} nests structs/arrays deeper than {max_nesting} "
                                "levels; flatten it (or serialize it, e.g. with to_json()) before "
                                "publishing")
    inner = depth + 1 if path else depth
    if kind == "array":
        _check_type(t["elementType"], f"{path}[]" if path else "[]", inner, max_nesting)
        return
    names = [f["name"] for f in t["fields"]]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DataFrameRejected(f"{where} has duplicate field names {dupes}; rename them (rows are "
                                "maps keyed by name)")
    for f in t["fields"]:
        _check_type(f["type"], f"{path}.{f['name']}" if path else f["name"], inner, max_nesting)


def type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    kind = t.get("type")
    if kind == "map":
        return f"map<{type_name(t['keyType'])},{type_name(t['valueType'])}>"
    if kind == "array":
        return f"array<{type_name(t['elementType'])}>"
    if kind == "struct":
        return "struct<" + ",".join(f"{f['name']}:{type_name(f['type'])}" for f in t["fields"]) + ">"
    return str(kind)


def arrow_schema(spark_schema: dict) -> pa.Schema:
    """The Arrow schema of a Spark schema (as JSON), the way Spark converts it: timestamps in
    microseconds (with a UTC zone; timestamp_ntz without), decimals as decimal128."""
    import pyarrow as pa

    return pa.schema([pa.field(f["name"], _arrow_type(f["type"]), f.get("nullable", True))
                      for f in spark_schema["fields"]])


def _arrow_type(t: Any) -> pa.DataType:
    import pyarrow as pa

    if isinstance(t, str):
        simple = {"boolean": pa.bool_(), "byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(),
                  "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
                  "string": pa.string(), "binary": pa.binary(), "date": pa.date32(),
                  "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
                  "void": pa.null(), "null": pa.null()}
        if t in simple:
            return simple[t]
        m = _DECIMAL.match(t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        if CHAR_TYPES.match(t):
            return pa.string()
    elif t.get("type") == "array":
        return pa.list_(pa.field("element", _arrow_type(t["elementType"]), t.get("containsNull", True)))
    elif t.get("type") == "struct":
        return pa.struct([pa.field(f["name"], _arrow_type(f["type"]), f.get("nullable", True))
                          for f in t["fields"]])
    raise DataFrameRejected(f"type {type_name(t)} has no Arrow form")


def spark_schema(schema: pa.Schema) -> dict:
    """The Spark schema (as JSON) whose `arrow_schema` holds the values of an Arrow `schema`
    (what a Ray Dataset records when it is published): DataFrameRejected for a type Spark has no
    form of (maps, unsigned 64-bit integers, half floats, ...)."""
    return {"type": "struct", "fields": [_spark_field(f, f.name) for f in schema]}


def _spark_field(f: pa.Field, path: str) -> dict:
    return {"name": f.name, "type": _spark_type(f.type, path), "nullable": f.nullable,
            "metadata": {}}


def _spark_type(t: pa.DataType, path: str) -> Any:
    import pyarrow as pa

    simple = [(pa.types.is_boolean, "boolean"), (pa.types.is_int8, "byte"),
              (pa.types.is_int16, "short"), (pa.types.is_uint8, "short"),
              (pa.types.is_int32, "integer"), (pa.types.is_uint16, "integer"),
              (pa.types.is_int64, "long"), (pa.types.is_uint32, "long"),
              (pa.types.is_float32, "float"), (pa.types.is_float64, "double"),
              (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
              (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"),
              (pa.types.is_date, "date"), (pa.types.is_null, "void")]
    for test, name in simple:
        if test(t):
            return name
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal128(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "elementType": _spark_type(t.value_type, path + "[]"),
                "containsNull": t.value_field.nullable}
    if pa.types.is_struct(t):
        return {"type": "struct", "fields": [_spark_field(f, f"{path}.{f.name}") for f in t]}
    raise DataFrameRejected(f"column {path!r} is of Arrow type {t}, which has no Spark form to "
                            "record on a topic; cast it first")


def wire_type(t: pa.DataType) -> pa.DataType:
    """The msgpack-native Arrow type rows mode sends a value of type `t` as (every field nullable):
    timestamp -> int64 microseconds, date -> int32 days, decimal -> string."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_decimal(t):
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(wire_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, wire_type(f.type)) for f in t])
    return t


def wire_schema(schema: pa.Schema) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(f.name, wire_type(f.type)) for f in schema])


def cast_array(arr: pa.Array | pa.ChunkedArray, target: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """Cast an Arrow array (or chunked array) to `target` field by field: unlike pyarrow's struct
    cast, the children of a null struct are masked first (they hold placeholders such as "" that a
    string -> decimal cast refuses)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        return pa.chunked_array([cast_array(c, target) for c in arr.chunks], type=target)
    if arr.type.equals(target):
        return arr
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(target):
        children = [cast_array(child, f.type) for child, f in zip(arr.flatten(), target, strict=True)]
        if not children:
            return pa.array([None if m else {} for m in mask.to_pylist()] if mask is not None
                            else [{}] * len(arr), type=target)
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) and pa.types.is_list(arr.type):
        values = cast_array(arr.values, target.value_type)
        return pa.ListArray.from_arrays(arr.offsets, values, type=target, mask=mask)
    return arr.cast(target)


def cast_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with the columns, types and field nullability of `schema` (same column names)."""
    import pyarrow as pa

    columns = [cast_array(table.column(f.name), f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def to_msgpack_rows(batch: pa.RecordBatch | pa.Table, wire: pa.Schema) -> list[dict]:
    """Rows of `batch` as dicts of msgpack-native values (see `wire_type`), built column by column
    (a third faster than Arrow's row by row `to_pylist`: it is the rows mode's hot path)."""
    import pyarrow as pa

    table = (batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])).cast(wire)
    names = table.column_names
    if not names:
        return [{} for _ in range(table.num_rows)]
    columns = [c.to_pylist() for c in table.columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def packed_rows(batch: pa.RecordBatch | pa.Table, wire: pa.Schema) -> list[bytes | memoryview]:
    """The rows of `batch` as msgpack maps. A flat batch (numbers, booleans, strings, binary,
    nulls) is encoded column by column in Arrow into one buffer, each row a memoryview of it:
    about a tenth of the cost of a dict and a Packer per row, which nested batches still take."""
    import pyarrow as pa

    table = (batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])).cast(wire)
    if table.num_rows and table.num_columns and all(_flat_tag(f.type) for f in table.schema):
        return _packed_flat(table)
    pack = msgpack.Packer(use_bin_type=True).pack
    return [pack(row) for row in to_msgpack_rows(table, wire)]


def _flat_tag(t: pa.DataType) -> str | None:
    """How `_packed_flat` encodes a wire type: "i" int 64, "u" uint 64, "f" float 64, "b" bool,
    "s" str 32, "y" bin 32, "n" nil; None for lists and structs."""
    import pyarrow as pa

    if pa.types.is_unsigned_integer(t):
        return "u" if t.bit_width == 64 else "i"
    if pa.types.is_integer(t):
        return "i"
    if pa.types.is_floating(t):
        return "f"
    if pa.types.is_boolean(t):
        return "b"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "s"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "y"
    if pa.types.is_null(t):
        return "n"
    return None


_FIXED = {"i": (0xD3, "int64", ">i8"), "u": (0xCF, "uint64", ">u8"), "f": (0xCB, "float64", ">f8")}
_LENGTH_PREFIXED = {"s": 0xDB, "y": 0xC6}


def _packed_flat(table: pa.Table) -> list[memoryview]:
    """Each row's msgpack map in one Arrow buffer: per column a binary array of key + value (the
    widest fixed-size msgpack form of each value, any decoder reads it), nulls as nil, joined
    row-wise; rows are views of the joined buffer."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n, width = table.num_rows, table.num_columns
    if width < 16:
        header = bytes([0x80 | width])
    elif width <= 0xFFFF:
        header = b"\xde" + width.to_bytes(2, "big")
    else:
        header = b"\xdf" + width.to_bytes(4, "big")
    binary = pa.large_binary()
    parts: list = [pa.repeat(pa.scalar(header, binary), n)]  # (an array: all may be scalars)
    for field, column in zip(table.schema, table.columns, strict=True):
        key = msgpack.packb(field.name, use_bin_type=True)
        column = column.combine_chunks()
        tag = _flat_tag(field.type)
        if tag == "n" or column.null_count == n:
            parts.append(pa.scalar(key + b"\xc0", binary))
            continue
        if tag in _FIXED:
            code, arrow_type, big_endian = _FIXED[tag]
            values = pc.fill_null(column.cast(arrow_type), 0).to_numpy(zero_copy_only=False)
            cells = _fixed_cells(key, code, values.astype(big_endian))
        elif tag == "b":
            values = pc.fill_null(column, False).to_numpy(zero_copy_only=False)
            cells = _fixed_cells(key, np.where(values, 0xC3, 0xC2), None)
        else:
            lengths = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
            heads = _fixed_cells(key, _LENGTH_PREFIXED[tag], lengths.astype(">u4"))
            cells = pc.binary_join_element_wise(heads, column.cast(binary), pa.scalar(b"", binary))
        if column.null_count:
            cells = pc.if_else(column.is_valid(), cells, pa.scalar(key + b"\xc0", binary))
        parts.append(cells)
    rows = pc.binary_join_element_wise(*parts, pa.scalar(b"", binary))
    _, offsets, data = rows.buffers()
    bounds = np.frombuffer(offsets, np.int64, n + 1, rows.offset * 8).tolist()
    view = memoryview(data)
    return list(map(view.__getitem__, map(slice, bounds, bounds[1:])))


def _fixed_cells(key: bytes, code, values) -> pa.Array:
    """A large_binary array of key + code byte(s) + the bytes of `values` (big-endian numpy
    values, one per row; None: nothing after the code)."""
    import numpy as np
    import pyarrow as pa

    n = len(code) if values is None else len(values)
    size = values.dtype.itemsize if values is not None else 0
    cells = np.empty((n, len(key) + 1 + size), np.uint8)
    cells[:, :len(key)] = np.frombuffer(key, np.uint8)
    cells[:, len(key)] = code
    if values is not None:
        cells[:, len(key) + 1:] = values.view(np.uint8).reshape(n, size)
    array = pa.FixedSizeBinaryArray.from_buffers(pa.binary(cells.shape[1]), n,
                                                 [None, pa.py_buffer(cells)])
    return array.cast(pa.large_binary())


def from_msgpack_rows(rows: list[dict], schema: pa.Schema) -> pa.Table:
    """The rows `to_msgpack_rows` made, back as an Arrow table of `schema`."""
    import pyarrow as pa

    return cast_table(pa.Table.from_pylist(rows, schema=wire_schema(schema)), schema)


def decode_payloads(payloads: list, ctypes: list[int], schema: pa.Schema) -> pa.Table:
    """Messages of one topic's run (rows or Arrow, as their content types say) as one Arrow table
    of `schema` (`arrow_schema` of the recorded Spark schema)."""
    import pyarrow as pa

    if not payloads:
        return schema.empty_table()
    if ctypes[0] == ContentType.ARROW:
        tables = [pa.ipc.open_stream(pa.BufferReader(p)).read_all() for p in payloads]
        return cast_table(pa.concat_tables(tables), schema)
    unpack = msgpack.unpackb
    return from_msgpack_rows([unpack(p, raw=False) for p in payloads], schema)


def end_message(msg) -> list | None:
    """The decoded end message (see the module docstring), if `msg` is one."""
    payload = msg.payload
    if msg.content_type != ContentType.MSGPACK or not payload or (payload[0] & 0xF0) != 0x90:
        return None
    try:
        value = msgpack.unpackb(payload, raw=False)
    except Exception:
        return None
    if isinstance(value, list) and len(value) == 7 and value[0] == END_TAG:
        return value
    return None
