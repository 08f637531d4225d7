"""Framing: out-of-band buffers are the object's own memory; signatures guard unpickling."""
import numpy as np
import pytest
import torch

from harness.control import wire


def _address(buffer) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


def test_large_arrays_and_tensors_go_out_of_band_without_copy():
    arr = np.random.rand(1 << 20)
    frames = wire.dumps(arr)
    assert len(frames) == 2 and _address(frames[1]) == arr.ctypes.data
    tensor = torch.randn(1 << 18)
    frames = wire.dumps(tensor)
    assert len(frames) == 2 and _address(frames[1]) == tensor.data_ptr()


def test_a_sealed_value_crosses_a_relay_unopened_and_its_large_buffers_stay_out_of_band():
    """A child's exchange value, sealed, goes to the parent, which unpacks the message and packs it on to another
    child: the relay holds only frames, and the receiver opens the value whole."""
    key = wire.new_key()
    value = {"big": torch.arange(1 << 16, dtype=torch.float32), "small": np.arange(5), "none": None}
    frames = wire.pack(key, ("exchange", "t", wire.Sealed.of(value)))
    assert len(frames) == 2                              # the big tensor's bytes, out of band in the message too
    relayed = wire.unpack(key, [bytearray(f) for f in frames])[2]        # frames as ZeroMQ hands them
    assert isinstance(relayed, wire.Sealed)
    again = wire.unpack(key, [bytearray(f) for f in wire.pack(key, [relayed, None])])[0].open()
    assert torch.equal(again["big"], value["big"]) and (again["small"] == value["small"]).all()
    assert again["none"] is None


def test_small_buffers_stay_in_band():
    assert len(wire.dumps(np.arange(10))) == 1


@pytest.mark.parametrize("size", [10, wire.PARALLEL_MIN + 12345])
def test_any_flipped_bit_fails_the_check(size):
    key = wire.new_key()
    frames = [bytearray(f) for f in wire.pack(key, np.ones(size, dtype=np.uint8))]
    assert (wire.unpack(key, frames) == 1).all()
    frames[-1][size // 2] ^= 1
    with pytest.raises(wire.BadSignature):
        wire.unpack(key, frames)


def test_wrong_key_and_moved_frame_boundaries_fail():
    key = wire.new_key()
    head, *bufs = wire.pack(key, {"a": np.ones(1 << 17)})
    with pytest.raises(wire.BadSignature):
        wire.unpack(wire.new_key(), [head, *bufs])
    joined = bytes(head) + bytes(bufs[0])
    with pytest.raises(wire.BadSignature):
        wire.unpack(key, [joined[:100], joined[100:]])


def test_parameters_stay_parameters():
    key = wire.new_key()
    layer = wire.unpack(key, wire.pack(key, torch.nn.Linear(300, 300)))
    assert type(layer.weight) is torch.nn.Parameter and layer.weight.requires_grad
    layer.weight = torch.nn.Parameter(torch.zeros(300, 300))      # still assignable as a module parameter


def test_a_function_sent_by_value_keeps_its_file_so_a_child_s_traceback_says_where_it_failed(tmp_path):
    """A function of the user's script (not importable, so cloudpickle sends its code) fails in the child with the
    script's path and line in its traceback, not cloudpickle's "<dynamic-code>"."""
    script = tmp_path / "script.py"
    script.write_text("def helper(x):\n    return 1 / x\n\ndef work(ctx):\n    return helper(0)\n")
    namespace = {"__name__": "not_importable"}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    key = wire.new_key()
    work = wire.unpack(key, wire.pack(key, namespace["work"]))
    assert work is not namespace["work"]                  # a copy made from the code sent
    with pytest.raises(ZeroDivisionError) as raised:
        work(None)
    frames = [(str(entry.path), entry.lineno + 1, entry.name) for entry in raised.traceback[1:]]
    assert frames == [(str(script), 5, "work"), (str(script), 2, "helper")], frames
