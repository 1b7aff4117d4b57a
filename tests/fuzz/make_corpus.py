#!/usr/bin/env python3
"""Writes the HAL fuzzer's seed corpus (tests/fuzz/corpus/).

Each seed is a small byte program for hal_fuzzer.cc, spelled here with one
helper per opcode so a reader can follow it; the byte layout of every op is
documented next to its helper and must match the order in which
hal_fuzzer.cc reads its arguments. libFuzzer mutates from these, so they
only need to reach each area quickly (copies, streams and events, host
tasks, out of memory, stale handles, a second thread). Run it again after
changing the program encoding:

    python3 tests/fuzz/make_corpus.py
"""
import os
import struct

u8 = lambda v: struct.pack("<B", v & 0xFF)
u16 = lambda v: struct.pack("<H", v & 0xFFFF)
u32 = lambda v: struct.pack("<I", v & 0xFFFFFFFF)
u64 = lambda v: struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def stream(i):      # a live stream: mode 4, index
    return u8(4) + u16(i)


def dead_stream(i):  # a destroyed stream: mode 0, index
    return u8(0) + u16(i)


def event(i):
    return u8(4) + u16(i)


def dead_event(i):
    return u8(0) + u16(i)


# op 0: ph_malloc(device, size); mode 2 = 1 + (n % 8192) bytes,
# 6 = the whole capacity, 8 = SIZE_MAX - n, 7 = all that is free.
def malloc(device, mode, n=None):
    b = u8(0) + u8(device) + u8(mode)
    m = mode % 10
    if m in (2, 3):
        b += u16(n)
    elif m in (4, 5, 9):
        b += u32(n)
    elif m == 8:
        b += u8(n)
    return b


def free_live(i):           # op 2, mode 0: the i-th live device buffer
    return u8(2) + u8(0) + u16(i)


def free_stale(i):          # op 2, mode 3: a freed device pointer
    return u8(2) + u8(3) + u16(i)


def free_interior(i, off):  # op 2, mode 4
    return u8(2) + u8(4) + u16(i) + u16(off)


def host_malloc(size):      # op 3, mode 2: 1 + size % 8192 bytes
    return u8(3) + u8(2) + u16(size)


def host_free_live(i):      # op 4, mode 0
    return u8(4) + u8(0) + u16(i)


def host_free_stale(i):     # op 4, mode 3
    return u8(4) + u8(3) + u16(i)


def pageable(size, fill=0x20):   # op 5, even mode: new[] of 1 + size bytes
    return u8(5) + u8(fill & 0xFE) + u16(size)


def host_write(i, off, length, seed):  # op 6, buffer i of all buffers
    return u8(6) + u16(i) + u16(off) + u16(length) + u8(seed)


# ops 7 (ph_memcpy) and 8 (ph_memcpy_async): buffers are indices into all
# live buffers in creation order; mode 5 = a valid copy.
def copy(dst, src, dst_off, src_off, length, mode=5):
    return u8(7) + u16(dst) + u16(src) + u8(mode) + u16(dst_off) + \
        u16(src_off) + u16(length)


def copy_async(dst, src, s, dst_off, src_off, length, mode=5):
    return u8(8) + u16(dst) + u16(src) + stream(s) + u8(mode) + \
        u16(dst_off) + u16(src_off) + u16(length)


def memset_async(dst, s, value, off, length, mode=2):  # op 10
    return u8(10) + u16(dst) + stream(s) + u8(mode) + u32(value) + \
        u16(off) + u16(length)


def check(i):                 # op 11: read back and compare with the shadow
    return u8(11) + u16(i)


def stream_create(device, priority=0):  # op 12
    return u8(12) + u8(device) + u32(priority)


def stream_destroy(handle):   # op 13
    return u8(13) + handle


def stream_query(handle):     # op 14
    return u8(14) + handle


def stream_sync(handle):      # op 15
    return u8(15) + handle


def wait_event(s, e):         # op 16
    return u8(16) + s + e


def event_create(timing=True):  # op 17
    return u8(17) + u8(1 if timing else 0)


def event_destroy(handle):    # op 18
    return u8(18) + handle


def record(e, s):             # op 19
    return u8(19) + e + s


def event_query(handle):      # op 20
    return u8(20) + handle


def event_sync(handle):       # op 21
    return u8(21) + handle


def elapsed(a, b):            # op 22
    return u8(22) + a + b


def launch(s, mode=1):        # op 23; mode 0 fails, 8 fails with INVALID_ARG
    return u8(23) + s + u8(mode)


def launch_fill(s, buf, off, length, byte):  # op 23, mode 4: kernel-view write
    return u8(23) + s + u8(4) + u16(buf) + u16(off) + u16(length) + u8(byte)


def set_device(d):            # op 25; 6 and 7 are invalid indices
    return u8(25) + u8(d)


def device_sync(d):           # op 26
    return u8(26) + u8(d)


def mem_info(d):              # op 27
    return u8(27) + u8(d)


def attributes(i, off):       # op 28, mode 1
    return u8(28) + u8(1) + u16(i) + u16(off)


def kernel_address_from_host(i):  # op 29
    return u8(29) + u16(i)


def worker(program):          # op 30: the next bytes run on a second thread
    assert len(program) < 256
    return u8(30) + u8(len(program)) + program


def join():                   # op 31
    return u8(31)


SEEDS = {
    "copies": b"".join([
        malloc(0, 2, 1000), malloc(1, 2, 3000), pageable(3000),
        host_malloc(2048), host_write(3, 0, 2049, 7),
        copy(0, 3, 0, 0, 1000),                 # pinned -> device 0
        stream_create(0),
        copy_async(1, 0, 0, 100, 0, 1000),      # device 0 -> device 1
        copy_async(2, 1, 0, 0, 0, 3001),        # device 1 -> pageable
        memset_async(0, 0, 0xAB, 10, 100),
        copy_async(3, 0, 0, 0, 0, 1000),        # device -> pinned
        check(0), check(1), check(2), check(3), stream_sync(stream(0)),
        attributes(0, 5), attributes(2, 1), attributes(3, 0),
        kernel_address_from_host(0),
        copy(0, 3, 990, 0, 64, mode=2),         # past the end: refused
        copy(0, 3, 0, 0, 64, mode=0),           # wrong kind: refused
        free_live(0), check(0),
    ]),
    "streams_events": b"".join([
        stream_create(0, -5), stream_create(1, 7), event_create(True),
        event_create(False), malloc(0, 2, 4000),
        launch_fill(stream(0), 0, 0, 512, 0x5A),
        record(event(0), stream(0)), wait_event(stream(1), event(0)),
        launch(stream(1)), record(event(1), stream(1)),
        event_query(event(0)), stream_query(stream(1)),
        event_sync(event(1)), elapsed(event(0), event(1)),
        record(event(1), stream(0)), elapsed(event(0), event(1)),
        launch(stream(1), mode=0),               # a failing task
        launch(stream(1)), stream_query(stream(1)), stream_sync(stream(1)),
        memset_async(0, 1, 1, 0, 16), device_sync(1), check(0),
        stream_destroy(stream(1)), stream_query(dead_stream(0)),
        event_destroy(event(1)), event_query(dead_event(0)),
        record(event(0), dead_stream(0)),
    ]),
    "out_of_memory": b"".join([
        mem_info(0), malloc(0, 6), malloc(0, 2, 10), mem_info(0),
        malloc(1, 8, 3), malloc(0, 9, 12345), free_live(0),
        malloc(0, 7), malloc(0, 5, 40 << 20), malloc(0, 5, 30 << 20),
        mem_info(0), free_live(0), free_live(0), mem_info(0),
        malloc(6, 2, 100), malloc(7, 0), mem_info(7), set_device(1),
        set_device(6), malloc(0, 0), host_malloc(0), u8(3) + u8(1),
    ]),
    "stale_handles": b"".join([
        malloc(0, 2, 600), malloc(1, 4, 70000), free_interior(0, 17),
        free_live(0), free_stale(0), host_malloc(100), host_free_live(0),
        host_free_stale(0), stream_create(0), event_create(),
        stream_destroy(stream(0)), stream_sync(dead_stream(0)),
        launch(dead_stream(0)), event_destroy(event(0)),
        event_sync(dead_event(0)), wait_event(stream(0), dead_event(0)),
        u8(14) + u8(1) + u64(0x1234), u8(20) + u8(3) + u16(0),
        u8(28) + u8(0) + u16(0),                 # attributes of freed memory
    ]),
    "two_threads": b"".join([
        stream_create(0), event_create(), malloc(0, 2, 2000),
        record(event(0), stream(0)),
        worker(b"".join([
            stream_create(1), malloc(1, 2, 1500), host_malloc(1500),
            copy_async(0, 1, 0, 0, 0, 1500),
            launch(stream(0)), u8(16) + stream(0) + event(0) + u8(0) + u16(0),
            u8(14) + u8(0) + u16(0),  # the main thread's stream
            stream_sync(stream(0)),
            check(0), device_sync(1),
        ])),
        memset_async(0, 0, 3, 0, 2000), launch(stream(0)), mem_info(0),
        event_sync(event(0)), join(), check(0), check(1), mem_info(1),
        free_live(1),
    ]),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
    print(f"{name}: {len(data)} bytes")
