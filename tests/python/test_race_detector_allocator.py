"""The race detector and the allocator's own waits.

Before cached memory goes back to the driver (``torch.phantom.empty_cache()``,
the retry after the driver ran out of memory) the allocator waits for every
stream of the device. The runtime traces that wait as a synchronize of the
device, with its index (torch.phantom._gpu_trace), so a block freed while
another stream still used it, released that way and obtained again by a
third stream is no race; a use the wait did not precede still is one.
``empty_cache()``'s wait for the events of blocks held back by
``record_stream`` comes just before, and the trace covers it. A raw clone
of a storage (c10's ``Allocator::clone``, which copy-on-write
materialization uses) waits for every stream of the source's device before
it copies, traced the same way.

Each program runs in a new process, from a file, as in test_race_detector.py.
"""
import pytest

from test_race_detector import CATCH, run

pytestmark = pytest.mark.no_race_detector(
    "plants races on purpose and switches the detector on in its own processes")

# x's block (4 MiB) is freed on the default stream while side's read of it
# may still run; `third` is a stream that never waited for either.
FREED_WHILE_READ = CATCH + """
third = torch.phantom.Stream()
x = torch.ones(1 << 20, device="phantom")
old = x.data_ptr()
side.wait_stream(default)
with torch.phantom.stream(side):
    y = x * 2                               # LINE-USE
del x

def reuse_on_third():
    with torch.phantom.stream(third):
        z = torch.empty(1 << 20, device="phantom")
        z.fill_(1)                          # LINE-REUSE
        z.sum().item()
    assert old <= z.data_ptr() < old + (4 << 20), "the block was not reused"
"""


def test_a_block_released_by_empty_cache_and_taken_by_a_third_stream_is_no_race():
    # empty_cache() waited for side before the block went back to the driver.
    result = run(FREED_WHILE_READ + """
torch.phantom.empty_cache()
print(json.dumps(attempt(reuse_on_third)))
""")
    assert result is None


def test_a_use_after_empty_cache_is_still_a_race_when_nothing_orders_it():
    # empty_cache() comes before side's use: it orders nothing after it.
    result = run(CATCH + """
x = torch.ones(1 << 20, device="phantom")
old = x.data_ptr()
torch.phantom.empty_cache()
x.mul_(2)                                   # default, after the wait
def use():
    with torch.phantom.stream(side):
        y = x + 1                           # LINE-READ: not ordered after mul_
print(json.dumps(attempt(use)))
""")
    assert result["kinds"] == ["unordered access"]
    assert "aten.mul_.Tensor writing" in result["text"]
    assert "LINE-READ" in result["text"]


def test_a_block_freed_while_in_use_after_empty_cache_is_still_reported():
    # The wait precedes the use: the free after it is unsafe, and the reuse
    # that follows without any order is reported.
    result = run(CATCH + """
x = torch.ones(1 << 20, device="phantom")
old = x.data_ptr()
torch.phantom.empty_cache()
side.wait_stream(default)
with torch.phantom.stream(side):
    y = x * 2                               # LINE-USE
del x
def reuse():
    z = torch.empty(1 << 20, device="phantom")
    z.fill_(1)
    assert z.data_ptr() == old, "the block was not reused"
print(json.dumps(attempt(reuse)))
""")
    assert result["kinds"] == ["freed while in use"]
    assert "LINE-USE" in result["text"]


# A 16 MiB device: with `filler` live, the third stream's 8 MiB does not fit
# until the allocator, out of memory, waits for every stream and gives x's
# cached segment back to the driver.
OUT_OF_MEMORY_RETRY = CATCH + """
third = torch.phantom.Stream()
x = torch.ones(2 << 20, device="phantom")   # 8 MiB
old = x.data_ptr()
filler = torch.ones(3 << 19, device="phantom")  # 6 MiB
side.wait_stream(default)
with torch.phantom.stream(side):
    y = x.sum()                             # LINE-USE: a read of x on side
del x

def reuse_on_third():
    with torch.phantom.stream(third):
        z = torch.empty(2 << 20, device="phantom")
        z.fill_(1)                          # LINE-REUSE
    third.synchronize()
    assert old <= z.data_ptr() < old + (8 << 20), "the block was not reused"
    retries = torch.phantom.memory_stats()["num_alloc_retries"]
    assert retries >= 1, "the allocation did not run out of memory"
"""


def test_a_block_released_by_the_out_of_memory_retry_is_no_race():
    result = run(OUT_OF_MEMORY_RETRY + """
print(json.dumps(attempt(reuse_on_third)))
""", env={"PHANTOM_DEVICE_MEMORY": "16MiB"})
    assert result is None


def test_a_synchronize_of_one_device_does_not_order_another_devices_streams():
    # The device synchronize carries its index: phantom:0's says nothing
    # about phantom:1's streams, phantom:1's orders them.
    result = run(CATCH + """
with torch.phantom.device(1):
    other = torch.phantom.Stream()
    a = torch.ones(1000, device="phantom:1")
    other.wait_stream(torch.phantom.current_stream())
    with torch.phantom.stream(other):
        a.mul_(2)                           # LINE-WRITE
def read():
    with torch.phantom.device(1):
        b = a + 1                           # LINE-READ, on phantom:1's default stream
torch.phantom.synchronize(0)
after_0 = attempt(read)
torch.phantom.synchronize(1)
print(json.dumps([after_0, attempt(read)]))
""", env={"PHANTOM_DEVICE_COUNT": "2"})
    assert result[0]["kinds"] == ["unordered access"]
    assert "LINE-WRITE" in result[0]["text"] and "LINE-READ" in result[0]["text"]
    assert result[1] is None


def test_the_allocator_wait_and_the_trace_callbacks_from_two_threads_do_not_deadlock():
    # The wait's trace callbacks take the GIL; they run with the allocator's
    # lock released, so a thread holding the GIL while it allocates (the
    # other one) never waits for a thread that waits for the GIL. Both
    # threads free memory used on another stream, empty the cache and take
    # the memory again on a third stream; neither report nor hang.
    result = run(CATCH + """
import threading
errors = []
def worker(rounds):
    try:
        mine, third = torch.phantom.Stream(), torch.phantom.Stream()
        for _ in range(rounds):
            x = torch.ones(1 << 18, device="phantom")
            mine.wait_stream(torch.phantom.current_stream())
            with torch.phantom.stream(mine):
                y = x * 2
            del x
            torch.phantom.empty_cache()
            with torch.phantom.stream(third):
                z = torch.empty(1 << 18, device="phantom")
                z.fill_(1)
            del y, z
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=worker, args=(50,)) for _ in range(2)]
for t in threads:
    t.start()
main_thread = attempt(lambda: worker(50))
for t in threads:
    t.join()
print(json.dumps({"errors": errors, "main": main_thread}))
""")
    assert result == {"errors": [], "main": None}


def test_empty_cache_orders_the_streams_of_blocks_held_back_by_record_stream():
    # y's block is held back for side by record_stream; empty_cache() waits
    # for it (and for every stream of the device): side's write of w is then
    # ordered before the default stream's read. A write on side after
    # empty_cache() is not.
    result = run(CATCH + """
y = torch.ones(1 << 20, device="phantom")
w = torch.ones(1000, device="phantom")
side.wait_stream(default)
with torch.phantom.stream(side):
    y.mul_(2)
    w.mul_(2)                               # LINE-WRITE-BEFORE
y.record_stream(side)
del y
torch.phantom.empty_cache()
ordered = attempt(lambda: w + 1)
side.wait_stream(default)
with torch.phantom.stream(side):
    w.mul_(2)                               # LINE-WRITE-AFTER
print(json.dumps([ordered, attempt(lambda: w + 1)]))
""")
    assert result[0] is None
    assert result[1]["kinds"] == ["unordered access"]
    assert "LINE-WRITE-AFTER" in result[1]["text"]


# A C++ extension that clones a tensor's storage with its allocator
# (Allocator::clone: allocate, then copy_data), as copy-on-write
# materialization does; torch gives Python no other way to it for phantom
# memory. Built once per machine (torch's extension cache).
RAW_CLONE = '''
from torch.utils.cpp_extension import load_inline
ext = load_inline("phantom_race_detector_raw_clone", cpp_sources="""
#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
void raw_clone(const at::Tensor& t) {
  c10::Allocator* allocator = t.storage().allocator();
  c10::DataPtr copy = allocator->clone(t.storage().data(), t.storage().nbytes());
}
""", functions=["raw_clone"])
'''


def test_a_raw_clone_of_a_storage_orders_every_stream_of_its_device():
    # The clone waited for side's write before copying: the default
    # stream's read after it is ordered. A write on side after the clone
    # is not.
    result = run(CATCH + RAW_CLONE + """
x = torch.ones(1000, device="phantom")
side.wait_stream(default)
with torch.phantom.stream(side):
    x.mul_(2)
ext.raw_clone(x)
ordered = attempt(lambda: x + 1)
side.wait_stream(default)
with torch.phantom.stream(side):
    x.mul_(2)                               # LINE-WRITE-AFTER
print(json.dumps([ordered, attempt(lambda: x + 1)]))
""")
    assert result[0] is None
    assert result[1]["kinds"] == ["unordered access"]
    assert "LINE-WRITE-AFTER" in result[1]["text"]
