"""A server freezes what it loaded out of the collector's sight, and still collects what it makes later.

Run in a child process: freezing the test process would keep every later-dropped model's cycles."""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc, weakref
    from specdec.rpc.server import freeze_heap

    class Node:
        pass

    loaded = [Node() for _ in range(1000)]          # stands for the model: alive before the freeze
    before = len(gc.get_objects())
    freeze_heap()
    assert gc.get_freeze_count() >= 1000, gc.get_freeze_count()
    assert len(gc.get_objects()) < before - 1000, (len(gc.get_objects()), before)
    a, b = Node(), Node()                           # a cycle made while serving
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None, "a cycle made after the freeze was not collected"
    print("ok")
""")


def test_freeze_heap_hides_what_is_loaded_and_collects_later_cycles():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
