"""The compiled Kineto slice decoder (``readers/_kscan.c``) against the typed msgspec decode
it stands in for: on every recorded trace's slices the tables are equal, and on damaged or
unusual input it either gives the same tables or gives up (the msgspec path then decides).
It must never accept what the typed decode would refuse or read tolerantly."""

from __future__ import annotations

import functools
import gzip
import json
import random
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import BYTE_MUTATIONS, STRUCT_MUTATIONS, kineto_seeds
from proflab.errors import InputError
from proflab.readers import _kineto_native as native
from proflab.readers import _slices, kineto

DATA = Path(__file__).parent / "data"

pytestmark = pytest.mark.skipif(
    not native.available(),
    reason="the compiled decoder is not built (no C compiler at install) or PROFLAB_PURE_PYTHON is set",
)


def _slow(payload: bytes):
    """The typed decode's tables, or what it does instead ("tolerant": a value of another
    type, read by the tolerant decoder; "refused": not JSON)."""
    try:
        events = kineto._EVENTS_DECODER.decode(payload)
    except msgspec.ValidationError:
        return "tolerant"
    except (msgspec.DecodeError, UnicodeDecodeError):
        return "refused"
    return kineto._tables(events)


def _equal(a: kineto._Tables, b: kineto._Tables) -> str | None:
    """None, or what differs."""
    for name in ("gpu", "cpu", "comms"):
        x, y = getattr(a, name), getattr(b, name)
        if x.schema != y.schema:
            return f"{name} schema"
        if not x.equals(y):
            return f"{name} rows"
    if list(a.unknown.items()) != list(b.unknown.items()):
        return "unknown categories"
    if a.events != b.events or a.problems != b.problems:
        return "counts"
    return None


def _agrees(payload: bytes) -> str:
    """Checks the decoder on one payload: "same" (equal tables) or "gave up" (and why is fine)."""
    fast = native.tables(payload)
    slow = _slow(payload)
    if fast is None:
        return "gave up"
    assert not isinstance(slow, str), f"accepted what the typed decode finds {slow}"
    diff = _equal(fast, slow)
    assert diff is None, diff
    return "same"


def _slices_of(path: Path, size: int, general: bool = False) -> list[bytes]:
    """The file's slices: in Kineto's layout where it is in it, else cut by its structure
    (a plain file's plan falls back by itself, a compressed one is read again)."""
    slicer = _slices.open_slicer(path, size, general=general)
    try:
        if isinstance(slicer, _slices.MappedSlicer):
            return [bytes(slicer.piece(b, e)) for b, e in slicer.plan()]
        return [bytes(p) for p in slicer.pieces()]
    except _slices.NotSliceable:
        if general or isinstance(slicer, _slices.MappedSlicer):
            raise
        return _slices_of(path, size, general=True)
    finally:
        slicer.close()


RECORDED = sorted(
    p for d in ("kineto", "compat", "realistic", "memory", "ncu", "runs") for p in (DATA / d).rglob("*.json*")
    if "trace" in p.name or d == "compat"
)  # fmt: skip


def test_recorded_traces_are_there():
    assert len(RECORDED) >= 30


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(DATA)))
def test_every_slice_of_every_recorded_trace(path):
    """Slices of 1 MiB (most traces are a few slices of it), each decoded both ways."""
    try:
        pieces = _slices_of(path, 1 << 20)
    except _slices.NotSliceable:
        pytest.skip("no traceEvents array to cut: decoded whole by the msgspec path")
    got = [_agrees(p) for p in pieces]
    if path.name.startswith("tracelens_mi300x_rocm_gemm"):
        assert "gave up" in got  # its streams are strings ("0x1f"): the tolerant decoder reads them
    else:
        assert set(got) == {"same"}, f"gave up on {got.count('gave up')} of {len(got)} slices"


def test_collectives_are_decoded():
    """DDP traces' record_param_comms calls (collective, sizes, group) come out the same."""
    paths = sorted((DATA / "kineto" / "scaling").rglob("rank*.pt.trace.json.gz"))[:4]
    seen = 0
    for path in paths:
        for piece in _slices_of(path, 64 << 20):
            fast = native.tables(piece)
            assert fast is not None and _equal(fast, _slow(piece)) is None
            seen += fast.comms.height
    assert seen > 0


def _event(**fields) -> dict:
    base = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.25,
            "args": {"correlation": 5, "External id": 9, "device": 0, "stream": 7, "grid": [1, 2, 3], "block": [4, 5, 6]}}  # fmt: skip
    base.update(fields)
    return base


def _payload(events: list) -> bytes:
    return json.dumps(events, ensure_ascii=False).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize(
    ("events", "outcome"),
    [
        ([_event()], "same"),
        ([_event(name="caf\u00e9 \u00fcber \U0001f600")], "same"),
        ([], "same"),
        ([{}], "same"),
        ([_event(pid="Spans"), _event(cat="cpu_op", tid="stream 7")], "same"),  # strings for pid/tid: read as text
        ([_event(pid=-5), _event(pid=2**40)], "same"),  # a GPU pid past int32: its digits, as the typed path reads them
        ([_event(ts=None), _event(ts=3)], "same"),  # a null start is dropped; an integer one is a float
        ([_event(ts=1771536568903147.123), _event(ts=-0.0), _event(dur=1e-7)], "same"),
        ([_event(args={})], "same"),
        ([_event(args={"grid": [1], "block": []}), _event(args={"grid": None})], "same"),
        ([_event(args={"Ev Idx": 1, "Concrete Inputs": ["", "a\"b\\c"], "x": {"y": [[], {}]}})], "same"),
        ([_event(cat="cpu_op", name="aten::mm", args={"Input type": ["float", "float"], "Input Dims": [[2, 3], [3, 4]]})], "same"),
        ([_event(cat="cpu_op", name="record_param_comms",
                 args={"Collective name": "allreduce", "dtype": "Float", "Process Group Name": 0, "In msg nelems": 8,
                       "Out msg nelems": 8, "Group size": 2, "External id": 3})], "same"),  # fmt: skip
        ([_event(cat="ac2g", ph="s", id=5), _event(cat="ac2g", ph="f", id="x")], "same"),
        ([_event(cat="kernel", args={"External id": 1})], "same"),  # no correlation and no flows
        ([_event(cat="kernel", args={}), _event(cat="ac2g", ph="f", id=5)], "gave up"),  # kernels linked by flows
        ([_event(name=5)], "gave up"),
        ([_event(ts="5")], "gave up"),
        ([_event(ts=1e17)], "gave up"),  # past the clock: the typed decode refuses it
        ([_event(dur=None)], "gave up"),
        ([_event(args=None)], "gave up"),
        ([_event(args={"device": 2**31})], "gave up"),
        ([_event(args={"correlation": 1.0})], "gave up"),
        ([_event(args={"grid": [1, "2"]})], "gave up"),
        ([_event(id=1.5)], "gave up"),
        ([_event(pid=True)], "gave up"),
        ([_event(pid=2**64)], "gave up"),
        ([5], "gave up"),
    ],
)
def test_values_taken_or_given_up(events, outcome):
    assert _agrees(_payload(events)) == outcome


def test_input_shapes_are_decoded_once_per_distinct_text_as_the_typed_path_does():
    """The decoder interns each shape value's JSON text; the rows take their decoded text from
    it. Repeated, null, malformed and escaped values, a shape text equal to a name's, every
    operator's shapes (element-wise ones too) and concrete inputs read as the typed decode
    reads them."""
    def op(name, **args):
        return _event(cat="cpu_op", name=name, args=args)

    events = [
        op("aten::mm", **{"Input type": ["float", "float"], "Input Dims": [[2, 3], [3, 4]]}),
        op("aten::addmm", **{"Input type": ["float", "float"], "Input Dims": [[2, 3], [3, 4]]}),
        op("aten::mm", **{"Input type": None, "Input Dims": {"not": "a list"}}),
        op("aten::linear", **{"Input type": ["c10::Half", "a\"b\u00e9"], "Input Dims": []}),
        op("aten::add", **{"Input type": ["float"], "Input Dims": [[5]]}),  # not a GEMM: kept too
        op("[[2, 3], [3, 4]]", **{"Input Dims": [[2, 3], [3, 4]]}),  # a name that is a shape's text
        op("aten::convolution", **{"Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3]], "Concrete Inputs": ["", "", "", "[2, 2]", "[1, 1]"]}),
        op("aten::mm"),
    ]
    assert _agrees(_payload(events)) == "same"
    cpu = native.tables(_payload(events)).cpu
    assert cpu.get_column("input_dims").to_list() == ["[[2,3],[3,4]]", "[[2,3],[3,4]]", None, "[]", "[[5]]",
                                                       "[[2,3],[3,4]]", "[[1,3,8,8],[4,3,3,3]]", None]  # fmt: skip
    assert cpu.get_column("input_concrete").to_list()[6] == '["","","","[2, 2]","[1, 1]"]'
    assert cpu.get_column("input_concrete").null_count() == 7
    assert cpu.get_column("input_types").to_list()[:4] == ["float,float", "float,float", None, 'c10::Half,a"b\u00e9']
    assert cpu.get_column("name").to_list()[5] == "[[2, 3], [3, 4]]"


def test_what_gpu_names_tell_is_found_once_per_name_and_read_per_row():
    """A copy's direction and memory kinds, and communication kernels, are found once per
    distinct name of a slice (``kineto.name_facts``) and applied with each row's kind: the
    same name as a copy and as a kernel, CUDA's and ROCm's copy names, a name that does not
    parse, NCCL kernels and a kernel named like a copy read as the typed decode reads them."""
    events = [
        _event(cat="gpu_memcpy", name="Memcpy HtoD (Pinned -> Device)"),
        _event(cat="gpu_memcpy", name="Memcpy DtoH (Device -> Pageable)"),
        _event(cat="gpu_memcpy", name="Memcpy HtoD (Pinned -> Device)"),
        _event(cat="kernel", name="Memcpy HtoD (Pinned -> Device)"),  # a kernel so named: no copy kind
        _event(cat="gpu_memcpy", name="CopyHostToDevice"),
        _event(cat="kernel", name="CopyHostToDevice"),
        _event(cat="gpu_memcpy", name="hipMemcpyDtoH"),
        _event(cat="gpu_memcpy", name="Memcpy ??? (odd)"),
        _event(cat="gpu_memset", name="Memset (Device)"),
        _event(cat="kernel", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
        _event(cat="gpu_memcpy", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ]
    assert _agrees(_payload(events)) == "same"
    gpu = native.tables(_payload(events)).gpu
    assert gpu.get_column("copy_kind").to_list() == ["HtoD", "DtoH", "HtoD", None, "HtoD", None, "DtoH", "unknown", None, None, "unknown"]
    assert gpu.get_column("src_kind").to_list()[:4] == ["Pinned", "Device", "Pinned", "Pinned"]
    assert gpu.get_column("is_comm").to_list() == [False] * 9 + [True, False]


def test_what_names_tell_is_kept_for_the_slices_after(monkeypatch):
    """What a GPU name tells and whether an operator's shapes are kept are worked out once per
    name for all the slices read (``_NameMemo``): slices that repeat names, add new ones, use a
    name as a kernel's in one slice and as an operator's in another, and slices read by two
    threads at once, read as the typed decode reads them; so do they where the memo is
    emptied on the way (a cap of three names), and each name is worked out once until then."""
    copies = ["Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)", "CopyHostToDevice", "odd"]
    ops = ["aten::mm", "aten::add", "aten::convolution", "Memcpy HtoD (Pinned -> Device)"]
    shapes = {"Input type": ["float", "float"], "Input Dims": [[2, 3], [3, 4]]}
    payloads = [
        _payload([_event(cat="gpu_memcpy", name=copies[(i + j) % 4]) for j in range(i % 3 + 1)]
                 + [_event(cat="cpu_op", name=ops[(i * 3 + j) % 4], args=shapes) for j in range(2)]
                 + [_event(cat="kernel", name=f"kernel_{i % 5}")])
        for i in range(24)
    ]  # fmt: skip
    monkeypatch.setattr(native, "_FACTS", native._NameMemo(kineto.name_facts))
    monkeypatch.setattr(native, "_SHAPES", native._NameMemo(kineto.shape_ops))
    told = []
    monkeypatch.setattr(native._FACTS, "_compute", lambda names: told.extend(names.to_list()) or kineto.name_facts(names))
    assert {_agrees(p) for p in payloads} == {"same"}
    assert sorted(told) == sorted(set(copies) | {f"kernel_{i}" for i in range(5)})  # each once
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        assert set(pool.map(_agrees, payloads * 2)) == {"same"}
    monkeypatch.setattr(native, "_MEMO_NAMES", 3)
    monkeypatch.setattr(native, "_FACTS", native._NameMemo(kineto.name_facts))
    monkeypatch.setattr(native, "_SHAPES", native._NameMemo(kineto.shape_ops))
    assert {_agrees(p) for p in payloads} == {"same"}
    assert len(native._FACTS._row) <= 4 and len(native._SHAPES._row) <= 4  # (a slice's own names, at most)


def test_keys_guessed_from_the_object_before_are_checked_whole():
    """A key is first compared with the key the last object of its kind had at that place:
    objects whose keys come in another order, or fewer or more of them, keys that only begin
    or end like the guess, a guessed key in another case, a key written twice where the guess
    matches both (given up, as for any key twice), and a guess at the slice's very end read as
    the typed decode reads them."""
    def kernel(args, **top):
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, **top, "args": args}

    events = [
        kernel({"correlation": 1, "stream": 7, "device": 0}),
        kernel({"stream": 8, "correlation": 2, "device": 1}),  # another order
        kernel({"correlatio": 3, "stream": 9}),  # the guess's first bytes
        kernel({"correlationX": 4, "Stream": 1, "device": 2, "grid": [1, 2, 3]}),  # longer; another case; one more
        kernel({"correlation": 5}, pid=3),  # fewer; a top-level key more
        {"cat": "kernel", "ph": "X", "ts": 1, "name": "k", "args": {"correlation": 6}},
    ]
    assert _agrees(_payload(events)) == "same"
    got = native.tables(_payload(events)).gpu
    assert got.get_column("correlation").to_list() == [1, 2, None, None, 5, 6]
    assert got.get_column("stream").to_list()[:4] == [7, 8, 9, 0]  # (no stream: the tid, absent)
    twice = _payload(events[:2]).replace(b'"device": 1', b'"device": 1, "device": 4')
    assert twice.count(b'"device"') == 3 and _agrees(twice) == "gave up"
    twice_top = _payload(events[:2])[:-2] + b',{"ph": "X", "cat": "kernel", "ph": "X"}]'
    assert _agrees(twice_top) == "gave up"
    for end in (b'{"ph":"X"}', b'{"ph":"X","cat":"kernel","name":"k","ts":1}', b'{"p":1}', b'{"phX":1}'):
        assert _agrees(b'[{"ph":"X","cat":"kernel","name":"k","ts":1},' + end + b"]") == "same", end


def test_keys_matched_at_the_end_of_a_slice_and_keys_that_only_begin_alike():
    """A key is matched by its first eight bytes as one word, read byte by byte where fewer
    than eight remain in the slice: keys in the slice's last bytes are still found, and keys
    that share a known key's first eight bytes (or are a known key's first bytes) are not it."""
    for key, value in (("ts", "1"), ("id", "1"), ("ph", '"X"'), ("dur", "2"), ("tid", "3"), ("name", '"k"'), ("cat", '"kernel"')):
        text = f'[{{"ph":"X","cat":"kernel","{key}":{value}}}]'.encode() if key not in ("ph", "cat") else f'[{{"{key}":{value}}}]'.encode()
        assert _agrees(text) == "same", text
    assert _agrees(b'[{"args":{"device":1}}]') == "same"
    assert _agrees(b'[{"args":{"correlation":7,"External id":2}}]') == "same"
    alike = _event(cat="kernel", args={"correlation": 7, "correlatio": "x", "correlationX": "y", "External idx": "z",
                                       "registers per threa": "w", "Python parent": 1.5, "gri": "v", "": 0})  # fmt: skip
    assert _agrees(_payload([alike])) == "same"
    tables = native.tables(_payload([alike]))
    assert tables.gpu.get_column("correlation").to_list() == [7] and tables.gpu.get_column("registers").to_list() == [None]


@pytest.mark.parametrize(
    "text",
    [
        b'[{"name": "a\\u00e9\\n\\t\\"\\\\\\/", "ph": "X", "cat": "cpu_op", "ts": 1}]',
        b'[{"name": "\\ud83d\\ude00", "ph": "X", "cat": "cpu_op", "ts": 1}]',
        b'[ {"ph":"X","cat":"cpu_op","name":"a","ts":1} ,\n {"ph":"X","cat":"cpu_op","name":"a","ts":2} ]\n',
    ],
)
def test_escapes_and_whitespace(text):
    assert _agrees(text) == "same"


# Text whose special bytes (quote, backslash, control character, non-ASCII) fall on either side
# of the 16 bytes the decoder looks at at once, and white space of every kind and length.
_TEXT = st.text(st.sampled_from(["a", "Z", "0", " ", ":", "é", "€", "😀", '"', "\\", "\n", "\t", "\x01", "\x7f"]), max_size=40)
_GAP = st.text(st.sampled_from([" ", "\n", "\r", "\t"]), max_size=40)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT, _GAP, _GAP), min_size=1, max_size=4), st.booleans())
def test_text_and_white_space_of_any_length_read_as_the_typed_decode_reads_them(events, at_end):
    """Names, categories, unknown keys and white space around every token: the same tables
    as the typed decode wherever the decoder accepts the slice, which it must do whenever
    no key needs an escape. ``at_end``: no padding after the array, so the last values end
    fewer than 16 bytes before the slice does."""
    parts = []
    for name, key, gap, gap2 in events:
        k = json.dumps(key, ensure_ascii=False)
        parts.append(
            f'{gap}{{{gap2}"ph"{gap}:{gap2}"X",{gap}"cat":{gap2}"cpu_op"{gap},{k}:{gap2}{json.dumps(name, ensure_ascii=False)},'
            f'{gap2}"name"{gap}:{json.dumps(name, ensure_ascii=False)}{gap},"ts":{gap2}1.5{gap}}}{gap2}'
        )
    payload = ("[" + ",".join(parts) + "]" + ("" if at_end else " " * 20)).encode()
    plain_keys = all(json.dumps(key, ensure_ascii=False) == f'"{key}"' for _, key, _, _ in events)
    known = {"ph", "cat", "name", "ts", "pid", "tid", "dur", "args", "id"}
    outcome = _agrees(payload)
    if plain_keys and not any(key in known for _, key, _, _ in events):
        assert outcome == "same", payload


@pytest.mark.parametrize("where", range(10, 22))
@pytest.mark.parametrize("byte", [b"\x01", b"\xff", b"\xed\xa0\x80", b"\\x", b'"'])
def test_a_bad_byte_either_side_of_sixteen_is_never_read_past(where, byte):
    """A raw control character, bytes that are not UTF-8 or a bad escape at each place around
    the 16 bytes looked at at once, in a name and in a key: given up on (or, for a quote that
    ends the name early, the same reading as the typed decode's or given up on)."""
    name = b"n" * where + byte + b"tail"
    for text in (b'[{"ph": "X", "cat": "cpu_op", "name": "' + name + b'", "ts": 1}]',
                 b'[{"ph": "X", "cat": "cpu_op", "' + name + b'": 1, "ts": 1}]'):  # fmt: skip
        outcome = _agrees(text)
        if byte != b'"':
            assert outcome == "gave up", text

@pytest.mark.parametrize(
    "text",
    [
        b'[{"name": "\\ud83d", "ph": "X", "cat": "cpu_op", "ts": 1}]',  # a lone surrogate
        b'[{"name": "\\udc00x", "ph": "X", "cat": "cpu_op", "ts": 1}]',
        b'[{"name": "a\xff", "ph": "X", "cat": "cpu_op", "ts": 1}]',  # not UTF-8
        b'[{"name": "a\xed\xa0\x80", "ph": "X", "cat": "cpu_op", "ts": 1}]',  # an encoded surrogate
        b'[{"name": "a\xc0\xaf", "ph": "X", "cat": "cpu_op", "ts": 1}]',  # overlong
        b'[{"x": "\xf4\x90\x80\x80", "ph": "X", "cat": "cpu_op", "ts": 1}]',  # past U+10FFFF, in a skipped value
        b'[{"name": "a\x01", "ph": "X"}]',  # a raw control character
        b'[{"name": "a", "name": "b"}]',  # a duplicated key
        b'[{"ph": "X", "args": {"stream": 1, "stream": 2}}]',
        b'[{"ts": NaN}]',
        b'[{"ts": 01}]',
        b'[{"ts": 1.}]',
        b'[{"ts": .5}]',
        b'[{"ts": 1e}]',
        b'[{"ts": +1}]',
        b'[{"ph": "X"},]',
        b'[{"ph": "X"}] x',
        b'[{"ph": "X"',
        b'{"ph": "X"}',
        b'[{"x": ' + b"[" * 100 + b"]" * 100 + b"}]",  # nested deeper than the decoder goes
    ],
)
def test_gives_up_on_what_the_typed_decode_does_not_take_as_is(text):
    assert isinstance(native.scan(text), str)
    assert _agrees(text) == "gave up"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(min_value=-9.2e15, max_value=9.2e15, allow_nan=False), st.integers(-(2**53), 2**53)),
       st.sampled_from(["repr", "e", "fixed", "long"]))  # fmt: skip
def test_numbers_convert_as_msgspec_does(value, form):
    """Starts and durations of any spelling give the typed decode's nanoseconds."""
    if form == "e":
        text = f"{float(value):.17e}"
    elif form == "fixed":
        text = f"{float(value):.6f}"
    elif form == "long":
        text = f"{float(value):.25f}" if abs(value) < 1e6 else repr(float(value))
    else:
        text = repr(value)
    if not -9.2e15 <= float(text) <= 9.2e15:
        return
    payload = f'[{{"ph": "X", "cat": "cpu_op", "name": "a", "ts": {text}, "dur": {text.lstrip("-")}}}]'.encode()
    assert _agrees(payload) == "same"


@functools.cache
def _seed_events() -> list[tuple[str, list]]:
    return [(name, doc["traceEvents"]) for name, doc in sorted(kineto_seeds().items())]


@pytest.mark.parametrize("index", range(240))
def test_damaged_events_never_read_differently(index):
    """The fuzzing suite's mutations of real events, as a slice: the decoder's tables are the
    typed decode's, or it gives up; never a different reading."""
    rng = random.Random(f"native:{index}")
    _, events = rng.choice(_seed_events())
    doc = {"traceEvents": json.loads(json.dumps(events))}
    for _ in range(rng.choice((1, 2))):
        rng.choice(list(STRUCT_MUTATIONS.values()))(doc, rng)
    events = doc.get("traceEvents")
    payload = json.dumps(events if isinstance(events, list) else [], allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if index % 2:
        payload = rng.choice(list(BYTE_MUTATIONS.values()))(payload, rng)
    _agrees(payload)


def test_tables_are_handed_over_without_a_copy_and_freed_with_the_slice_tables():
    """The parse writes each kind's table, a row of its words per event, into a buffer that
    becomes the table (read-only, no copy: numpy views each column in it); they are freed once the
    slice's tables are built (polars holds none of them), and at once where the decoder gives
    up."""
    from proflab.readers import _kscan

    payload = _slices_of(DATA / "kineto" / "train_loop.pt.trace.json.gz", 1 << 20)[0]
    before = _kscan.live()
    count, tables, strings = _kscan.scan(payload, native._categories())
    assert _kscan.live() == before + 4 and count > 1000 and strings[0] == ""
    rows = [t.shape() for t in tables]  # gpu, op, frame, other: (rows, room, columns)
    assert all(room >= n for n, room, _ in rows) and rows[1][0] > 1000 and sum(n for n, _, _ in rows) <= count
    assert [width for _, _, width in rows] == [len(native._FIELDS[k]) for k in (native._GPU, native._OP, native._FRAME, 0)]
    view = memoryview(tables[1])
    assert view.readonly and view.nbytes == rows[1][1] * rows[1][2] * 8
    with pytest.raises(TypeError):
        view[0] = 0
    ops = native._columns(native._OP, tables[1])
    assert all(c.size == rows[1][0] and c.strides == (8 * rows[1][2],) and np.shares_memory(c, np.frombuffer(view, np.uint8)) for c in ops.values())
    assert ops["ts"].dtype == np.float64 and ops["valid"].dtype == np.uint64 and ops["name"].dtype == np.int64
    del view, tables, ops
    assert _kscan.live() == before
    built = native.tables(payload)
    assert built is not None and built.cpu.height > 1000 and _kscan.live() == before
    for broken in (b"[{\"ph\": 1}]", b"[{\"ts\": 1.5}, {", b"[" + b"{\"name\": \"x\"}," * 5000 + b"{\"name\": 2}]"):
        assert isinstance(_kscan.scan(broken, native._categories()), str) and _kscan.live() == before


def test_each_kind_to_its_table_however_the_kinds_share_out():
    """A table's room is first guessed from the slice before (its kinds' shares of the events):
    slices that are all GPU activity, then all operators, then all Python frames, then all of
    other kinds, and mixed again, grow their tables from a guess far too small, and read as the
    typed decode reads them. Operators and frames of a phase other than "X" are left out,
    GPU activity of any phase kept; a category written with escapes is the usual path's."""
    from proflab.readers import _kscan

    def events(cat, n, ph="X"):
        return [_event(cat=cat, name=f"{cat}_{i % 7}", ph=ph, args={"External id": i, "correlation": i}) for i in range(n)]

    runs = [events("kernel", 3000), events("cpu_op", 5000), events("python_function", 4000), events("ac2g", 3000, ph="s"),
            events("kernel", 10) + events("cpu_op", 2000, ph="i") + events("user_annotation", 3000) + events("kernel", 2000, ph="i")]  # fmt: skip
    for run in runs * 2:
        assert _agrees(_payload(run)) == "same"
    count, tables, _ = _kscan.scan(_payload(runs[-1]), native._categories())
    assert count == 7010 and [t.shape()[0] for t in tables] == [2010, 3000, 0, 0]
    assert isinstance(_kscan.scan(b'[{"ph":"X","cat":"cpu\\u005fop","name":"a","ts":1}]', native._categories()), str)


def test_reads_are_the_same_with_threads_and_without(monkeypatch, tmp_path):
    """A whole read in many slices: two threads with the compiled decoder, one thread with
    it, and the msgspec decode alone give the same trace."""
    src = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    threads = kineto.read(plain)
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    one = kineto.read(plain)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    pure = kineto.read(plain)
    for t in (threads, one):
        for name in ("gpu", "cpu", "steps", "devices", "comms"):
            assert getattr(t, name).equals(getattr(pure, name)), name
        assert t.meta == pure.meta


@pytest.mark.parametrize("window", [2, 3])
def test_slices_in_hand_at_once_are_bounded(window):
    """``_in_order`` decodes on two threads and holds at most ``window`` items at once (handed
    out and not yet taken), taking them in order whatever order they finish in."""
    import threading
    import time

    lock, handed, taken, most, threads = threading.Lock(), [0], [0], [0], set()

    def items():
        for i in range(12):
            with lock:
                handed[0] += 1
                most[0] = max(most[0], handed[0] - taken[0])
            yield i

    def decode(index, item):
        threads.add(threading.current_thread().name)
        time.sleep(0.03 if index % 3 == 0 else 0.005)  # (a slow one now and then: the rest wait to be taken)
        return item

    def took(n):
        with lock:
            taken[0] = n

    assert kineto._in_order(decode, items(), took, window) == list(range(12))
    assert most[0] == window and len(threads) == kineto._THREADS


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_a_plain_file_has_one_slice_more_in_hand_than_threads(monkeypatch, tmp_path, name):
    """A plain file's slices are handed out one ahead of the two threads (a thread done with
    its slice goes on while the oldest is decoded); a .gz file's are not (each waiting slice is
    held inflated)."""
    src = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    path = tmp_path / name
    path.write_bytes(src.read_bytes() if name.endswith(".gz") else gzip.decompress(src.read_bytes()))
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    windows = []
    real = kineto._in_order
    monkeypatch.setattr(kineto, "_in_order", lambda *a: windows.append(a[3] if len(a) > 3 else kineto._THREADS) or real(*a))
    kineto.read(path)
    assert windows == [kineto._THREADS + (0 if name.endswith(".gz") else 1)]


def test_large_plain_files_are_cut_in_wider_slices_where_threads_decode(monkeypatch, tmp_path):
    """Two threads decode a plain file of ``WIDE_FROM_BYTES`` or more in slices twice
    ``_CHUNK_BYTES`` wide (fewer slices, each one's fixed cost paid half as often), with the
    same trace; a smaller file, a .gz file, and a read without the threads keep the slices."""
    src = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    plain, gz = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    gz.write_bytes(src.read_bytes())
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    cut: list[int] = []
    opened = kineto.open_slicer
    monkeypatch.setattr(kineto, "open_slicer", lambda path, size, **kw: cut.append(size) or opened(path, size, **kw))
    narrow = kineto.read(plain)
    monkeypatch.setattr(kineto, "WIDE_FROM_BYTES", plain.stat().st_size)
    wide = kineto.read(plain)
    kineto.read(gz)
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    kineto.read(plain)
    assert cut == [64 << 10, 128 << 10, 64 << 10, 64 << 10]
    for name in ("gpu", "cpu", "steps", "devices", "comms"):
        assert getattr(wide, name).equals(getattr(narrow, name)), name
    assert wide.meta == narrow.meta


@pytest.mark.parametrize("inflater", ["isal", "zlib"])
def test_gzip_is_inflated_by_a_thread_beside_the_decoding(monkeypatch, tmp_path, inflater):
    """A .gz trace: one thread decompresses and cuts slices (with ISA-L, or zlib) while two
    others decode them; the same trace as one thread doing both, and as the msgspec decode. A
    truncated one ends in the one-line error naming the file, and no thread is left behind."""
    import threading

    if inflater == "isal":
        pytest.importorskip("isal")
        assert _slices._inflater()[0].__module__ != "zlib"
    else:
        monkeypatch.setenv("PROFLAB_ZLIB", "1")
        assert _slices._inflater()[0] is zlib.decompressobj
    src = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    inflated: list = []
    real = kineto._decoded_while_inflating
    monkeypatch.setattr(kineto, "_decoded_while_inflating", lambda *a: inflated.append(1) or real(*a))
    decoders: set = set()
    real_tables = kineto._slice_tables
    monkeypatch.setattr(kineto, "_slice_tables", lambda p: decoders.add(threading.current_thread().name) or real_tables(p))
    both = kineto.read(src)
    assert inflated == [1]
    assert len(decoders) == kineto._THREADS and all(n.startswith("proflab-read") for n in decoders)
    monkeypatch.setenv("PROFLAB_READ_PROCESSES", "1")
    one = kineto.read(src)
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    pure = kineto.read(src)
    assert inflated == [1]
    for t in (both, one):
        for name in ("gpu", "cpu", "steps", "devices", "comms"):
            assert getattr(t, name).equals(getattr(pure, name)), name
        assert t.meta == pure.meta
    monkeypatch.delenv("PROFLAB_READ_PROCESSES")
    monkeypatch.delenv("PROFLAB_PURE_PYTHON")
    cut = tmp_path / "cut.pt.trace.json.gz"
    cut.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    before = threading.active_count()
    with pytest.raises(InputError) as e:
        kineto.read(cut)
    assert "cut.pt.trace.json.gz" in str(e.value) and "truncated" in str(e.value)
    assert inflated == [1, 1] and threading.active_count() == before


def test_threads_stop_on_a_broken_slice(monkeypatch, tmp_path):
    """A slice that is not JSON ends the threaded read with the decode error (the reader then
    decodes the whole document, which names the place), and no slice is left decoding."""
    src = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    data = bytearray(gzip.decompress(src.read_bytes()))
    at = len(data) // 2
    data[at : at + 8] = b"\x00" * 8
    broken = tmp_path / "t.json"
    broken.write_bytes(bytes(data))
    monkeypatch.setattr(kineto, "_CHUNK_BYTES", 64 << 10)
    with pytest.raises(msgspec.DecodeError):
        kineto._read_sliced(broken)
    with pytest.raises(InputError) as e:
        kineto.read(broken)
    assert "t.json" in str(e.value)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PROFLAB_PURE_PYTHON", "1")
    assert not native.available()


def test_a_build_of_another_version_is_not_used(monkeypatch):
    """An in-place build left from an older source (an install not rebuilt after an update)
    reports another version or record layout: the reader does not use it. (A stand-in module
    plays that build: one cannot be made here without a second compiler run.)"""
    import importlib
    import sys
    import types

    from proflab import readers

    stale = types.ModuleType("proflab.readers._kscan")
    stale.layout = lambda: (0, 8 * len(native.WORDS), 20, 5, (2, 1, 3, 0), ())
    monkeypatch.setitem(sys.modules, "proflab.readers._kscan", stale)
    monkeypatch.setattr(readers, "_kscan", stale)
    try:
        assert not importlib.reload(native).available()
    finally:
        monkeypatch.undo()
        importlib.reload(native)
    assert native.available()


def test_a_build_without_the_structure_scan_leaves_the_slicer_to_numpy(monkeypatch):
    """A build from before the structure scan existed has no ``structure``: the slicer of other
    layouts does not call it (an AttributeError mid-read) but cuts with numpy, where a current
    build cuts. (A stand-in module plays that build, as above; a fresh copy of the slicer's
    module imports it, so the module every other test uses is left as it is.)"""
    import importlib.util
    import sys
    import types

    from proflab import readers

    data = json.dumps({"traceEvents": [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1} for i in range(2000)]},
                      indent=2).encode()  # fmt: skip
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    old = types.ModuleType("proflab.readers._kscan")
    old.layout = lambda: ()
    monkeypatch.setitem(sys.modules, "proflab.readers._kscan", old)
    monkeypatch.setattr(readers, "_kscan", old, raising=False)
    spec = importlib.util.spec_from_file_location("_slices_beside_an_old_build", _slices.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert copy._kscan is None and copy._Structure().native is False
    monkeypatch.undo()
    assert copy.boundaries(chunks, 5_000) == _slices.boundaries(chunks, 5_000)


def test_a_slice_of_only_braces_sizes_its_tables_from_what_was_parsed():
    """A first slice of only '{' once sized each table from its braces (216 bytes of room an
    input byte: 3.6 GB for 16 MiB, where nothing was parsed), and the MemoryError where that
    failed was not caught. In a child held to 1 GiB of address space, a 16 MiB slice of
    braces is given up with a reason; a slice of real events gets room for what it holds."""
    import subprocess
    import sys

    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from proflab.readers import _kineto_native as n\n"
        "got = n.scan(b'[' + b'{' * (16 << 20))\n"
        "assert isinstance(got, str), got\n"
        "events = b'[' + b','.join(b'{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"ts\":%d,\"dur\":1}' % i for i in range(5000)) + b']'\n"
        "count, tables, strings = n._kscan.scan(events, n._categories())\n"
        "shapes = [t.shape() for t in tables]\n"
        "assert count == 5000 and all(cap <= 2 * max(rows, 1024) for rows, cap, _ in shapes), shapes\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_any_failure_of_the_decoder_falls_back_to_the_usual_path(monkeypatch):
    """A MemoryError (or any error) where the compiled decoder sizes or builds a slice's
    tables: the slice is decoded by msgspec, the same trace comes out."""
    from proflab.readers import _kscan

    path = DATA / "kineto" / "train_loop.pt.trace.json.gz"
    want = kineto.read(path)

    def refuse(*a):
        raise MemoryError

    monkeypatch.setattr(_kscan, "scan", refuse)
    assert native.scan(b"[]") == "out of memory" and native.tables(b"[]") is None
    got = kineto.read(path)
    for table in ("gpu", "cpu", "steps", "devices"):
        assert getattr(got, table).equals(getattr(want, table)), table
    monkeypatch.setattr(native, "_tables_of", lambda payload: 1 / 0)
    assert native.tables(b"[]") is None


# -- the structure of a document in another layout (readers._slices._Structure) ----------------
def _reads(scan, data: bytes, read: int) -> list:
    """Each read's commas (or where the scan gave up) and the state after it."""
    out = []
    for at in range(0, len(data), read):
        try:
            commas = scan.feed(data[at : at + read], at).tolist()
        except _slices.NotSliceable:
            return [*out, "not sliceable"]
        out.append((commas, scan.in_string, scan.backslashes, scan.depth, scan.close_at, scan.last_sep))
    return out


def _opened(native: bool, inner: int):
    """A scan as it stands once the events array opened at depth ``inner``."""
    scan = _slices._Structure(native=native)
    scan._started, scan.open_at, scan._inner, scan.depth = True, -1, inner, inner
    return scan


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\\\\", b"a", b" ", b"\n", b'"x,y"']),
                max_size=200).map(b"".join), st.integers(1, 40), st.integers(1, 3))  # fmt: skip
def test_the_compiled_structure_scan_finds_what_numpy_finds(data, read, inner):
    """Brackets, commas, colons, quotes and runs of backslashes in any order, read a few bytes
    at a time: each read's commas, whether it ends in a string, its run of backslashes, its
    depth and the array's close are numpy's (and both give up on the same read)."""
    assert _reads(_opened(True, inner), data, read) == _reads(_opened(False, inner), data, read)


@pytest.mark.parametrize("read", [4096, 1 << 20])
def test_a_recorded_trace_in_another_layout_is_cut_where_numpy_cuts_it(read, monkeypatch):
    """A recorded trace (escaped names, shapes, stacks' quotes) written compact on one line and
    by ``json.dumps(indent=2)``: the slices' cuts are those numpy's scan finds."""
    doc = json.loads(gzip.decompress((DATA / "kineto" / "train_loop.pt.trace.json.gz").read_bytes()))
    for data in (json.dumps(doc, separators=(",", ":")).encode(), json.dumps(doc, indent=2).encode()):
        chunks = [data[i : i + read] for i in range(0, len(data), read)]
        native = _slices.boundaries(chunks, 50_000)
        monkeypatch.setattr(_slices, "_kscan", None)
        assert _slices._Structure().native is False
        assert _slices.boundaries(chunks, 50_000) == native
        monkeypatch.undo()
        assert len(native[1]) > 20
