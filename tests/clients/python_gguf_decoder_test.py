"""The GGUF llama decoder of examples/gguf_decoder through a real kilnd (ctest label
`clients`), and stateful sessions (CreateSessionRequest.state):

- the numpy q8_0 / q4_k encoders write blocks that kilnd's GGUF reader
  (engine/io/gguf.cc, through the model repository) decodes to the values the
  numpy decoder gives;
- prefill + 15 greedy decode steps in kilnd, the KV cache kept in the session,
  give exactly the tokens of the numpy f64 reference of the same model;
- every bad state binding is INVALID_ARGUMENT naming it;
- a run that fails in a kernel leaves the state as it was; SetParams resets it.

Run by ctest with /usr/bin/python3 and the environment of
python_client_test.py (PYTHONPATH, KILND, KILN_SOURCE_DIR).
"""

import os
import pathlib
import shutil
import sys
import tempfile
import unittest

import grpc
import numpy as np

import kiln

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from python_client_test import Kilnd  # noqa: E402 (the same kilnd helper)

SOURCE = pathlib.Path(os.environ.get("KILN_SOURCE_DIR", HERE.parents[1]))
sys.path.insert(0, str(SOURCE / "examples" / "gguf_decoder"))
import llama_gguf  # noqa: E402

PROMPT = [1, 5, 9, 33, 200, 7, 300, 12]
STEPS = 16


def blocks_graph():
    """Dequantizes a q4_k and a q8_0 tensor of the decoder's file whole."""
    from kiln._proto.kiln.v1 import graph_pb2
    g = kiln.Graph("gguf_blocks")
    for out, name, dtype, shape in (("q4_k", "blk.0.attn_q.weight", "q4_k", (256, 256)),
                                    ("q8_0", "blk.1.ffn_down.weight", "q8_0", (256, 512))):
        w = g.param(name, dtype, shape)
        attrs = graph_pb2.Attrs()
        attrs.dequantize.SetInParent()
        g.output(out, g.node("dequantize", [w], attrs))
    return g


def setUpModule():
    global CACHE, REPO, KILND_PROC, CLIENT, INFO
    CACHE = tempfile.mkdtemp(prefix="kiln_py_gguf_cache.")
    REPO = tempfile.mkdtemp(prefix="kiln_py_gguf_models.")
    _, INFO = llama_gguf.write_model_dir(os.path.join(REPO, "tiny_llama", "1"), seed=0)
    blocks = os.path.join(REPO, "gguf_blocks", "1")
    os.makedirs(blocks)
    shutil.copy(os.path.join(REPO, "tiny_llama", "1", "model.gguf"), blocks)
    with open(os.path.join(blocks, "model.pb"), "wb") as f:
        f.write(blocks_graph().proto().SerializeToString())
    KILND_PROC = Kilnd(CACHE, [f"--model_repository={REPO}"])
    CLIENT = kiln.connect(KILND_PROC.addr)


def tearDownModule():
    CLIENT.close()
    KILND_PROC.stop()
    shutil.rmtree(CACHE, ignore_errors=True)
    shutil.rmtree(REPO, ignore_errors=True)


def state_graph():
    """s_out = s + x, bound back to s; a loss whose labels can fail the run in a kernel."""
    g = kiln.Graph("state_acc")
    x = g.input("x", "f32", [4])
    logits = g.input("logits", "f32", [2, 3])
    labels = g.input("labels", "i32", [2])
    s = g.param("s", "f32", [4])
    g.param("m", "f32", [2, 2])
    g.output("s_out", s + x)
    g.output("loss", g.softmax_cross_entropy(logits, labels))
    g.output("wide", g.reshape(s, [2, 2]))
    return g


class GgufDecoderTest(unittest.TestCase):
    def test_kiln_reader_decodes_the_numpy_blocks(self):
        with CLIENT.create_session(kiln.model("gguf_blocks")) as s:
            out = s.run({})
        for key, name in (("q4_k", "blk.0.attn_q.weight"), ("q8_0", "blk.1.ffn_down.weight")):
            want = INFO.values(name)
            self.assertEqual(out[key].shape, want.shape)
            # f16 scales times small integers: exact in f64, one f32 rounding in Kiln.
            np.testing.assert_allclose(out[key], want, rtol=2e-7, atol=1e-9, err_msg=key)
            self.assertGreater(np.abs(want).max(), 0.1)

    def test_decode_in_kilnd_matches_the_reference(self):
        want, margin = llama_gguf.Reference(INFO).generate(PROMPT, STEPS)
        # The comparison means something only where f32 cannot flip the argmax.
        self.assertGreater(margin, 1e-3)
        with CLIENT.create_session(kiln.model("tiny_llama"), state={"cache_out": "cache"}) as s:
            out = s.run({"tokens": np.array([PROMPT], np.int32),
                         "positions": np.arange(len(PROMPT), dtype=np.int32)})
            self.assertEqual(sorted(out), ["next_token"])  # the cache stays in kilnd
            got, pos = [int(out["next_token"][0, 0])], len(PROMPT)
            for _ in range(STEPS - 1):
                out = s.run({"tokens": np.array([[got[-1]]], np.int32),
                             "positions": np.array([pos], np.int32)})
                got.append(int(out["next_token"][0, 0]))
                pos += 1
            self.assertEqual(got, want)
            # The cache in kilnd holds the keys of every position seen, zeros after.
            cache = s.get_params(["cache"])["cache"]
            self.assertTrue(np.all(cache[:, :, :, pos - 1] != 0))
            self.assertTrue(np.all(cache[:, :, :, pos:] == 0))
            # SetParams resets the state: the same prompt again gives the same tokens.
            s.set_params({"cache": np.zeros_like(cache)})
            out = s.run({"tokens": np.array([PROMPT], np.int32),
                         "positions": np.arange(len(PROMPT), dtype=np.int32)})
            self.assertEqual(int(out["next_token"][0, 0]), want[0])

    def test_int8_activations_session_runs_the_int8_path(self):
        # CompileOptions.allow_int8_activations through kilnd: every DequantMatMul of
        # the prefill (M = 8, 1 for the LM head) and of a decode step (M = 1) takes
        # the CPU's int8 path
        # (the report names it), an exact session's none; greedy tokens come out.
        def dequant_steps(report):
            return [st.implementation for st in report.steps if "dequant_matmul" in st.implementation]

        with CLIENT.create_session(kiln.model("tiny_llama"), state={"cache_out": "cache"}) as s:
            _, rep = s.run({"tokens": np.array([PROMPT], np.int32),
                            "positions": np.arange(len(PROMPT), dtype=np.int32)}, report=True)
            exact = dequant_steps(rep)
        self.assertTrue(exact)
        self.assertFalse([i for i in exact if "_int8_" in i], exact)
        with CLIENT.create_session(kiln.model("tiny_llama"), state={"cache_out": "cache"},
                                   allow_int8_activations=True) as s:
            out, rep = s.run({"tokens": np.array([PROMPT], np.int32),
                              "positions": np.arange(len(PROMPT), dtype=np.int32)}, report=True)
            prefill = dequant_steps(rep)
            self.assertEqual(len(prefill), len(exact))
            for impl in prefill:  # the LM head reads the last position only: matvec
                self.assertRegex(impl, "_(small_batch|matvec)_int8_")
            self.assertTrue([i for i in prefill if "_small_batch_int8_" in i], prefill)
            got, pos = [int(out["next_token"][0, 0])], len(PROMPT)
            out, rep = s.run({"tokens": np.array([[got[-1]]], np.int32),
                              "positions": np.array([pos], np.int32)}, report=True)
            for impl in dequant_steps(rep):
                self.assertIn("_matvec_int8_", impl)
            got.append(int(out["next_token"][0, 0]))
        self.assertTrue(all(0 <= t < llama_gguf.TINY["vocab"] for t in got), got)


class StateBindingTest(unittest.TestCase):
    def assertRefused(self, state, *needles, graph=None):
        with self.assertRaises(kiln.KilnError) as cm:
            CLIENT.create_session(graph or state_graph(), state=state)
        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        for n in needles:
            self.assertIn(n, str(cm.exception))

    def test_bad_bindings_are_refused_by_name(self):
        self.assertRefused({"nope": "s"}, 'output "nope"', "no output by that name", "s_out")
        self.assertRefused({"s_out": "nope"}, 'param "nope"', "no param by that name")
        self.assertRefused({"s_out": "x"}, "that is an input")
        self.assertRefused({"s_out": "m"}, "f32[4]", "f32[2, 2]", "shapes differ")
        self.assertRefused({"loss": "s"}, 'output "loss"', "shapes differ")
        self.assertRefused({"s_out": ""}, "name both an output and a param")
        g = kiln.Graph("state_dtype")
        x = g.input("x", "f32", [4])
        g.param("s", "f16", [4])
        g.output("y", x)
        self.assertRefused({"y": "s"}, "f16[4]", "dtypes differ", graph=g)
        g = kiln.Graph("state_symbolic")
        x = g.input("x", "f32", ["n"])
        g.param("s", "f32", [4])
        g.output("y", x)
        self.assertRefused({"y": "s"}, "fixed shape", graph=g)

    def test_bound_twice_is_refused(self):
        from kiln._proto.kiln.v1 import service_pb2
        g = state_graph()
        g.output("s_again", g.param("s2", "f32", [4]) * 2.0)
        for pairs, needle in (([("s_out", "s"), ("s_again", "s")], "the param is bound twice"),
                              ([("s_out", "s"), ("s_out", "s2")], "the output is bound twice")):
            req = service_pb2.CreateSessionRequest(graph=kiln.graph_source(g))
            for o, p in pairs:
                req.state.add(output=o, param=p)
            with self.assertRaises(kiln.KilnError) as cm:
                CLIENT._call("CreateSession", req)
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(needle, str(cm.exception))
            self.assertIn("state[1]", str(cm.exception))

    def test_state_refuses_batching_and_training(self):
        from kiln._proto.kiln.v1 import service_pb2
        for what, needle in (("batching", "cannot batch"), ("training", "inference sessions")):
            req = service_pb2.CreateSessionRequest(graph=kiln.graph_source(state_graph()))
            req.state.add(output="s_out", param="s")
            if what == "batching":
                req.options.batching.max_batch = 4
            else:
                req.options.transforms.training.loss = "loss"
            with self.assertRaises(kiln.KilnError) as cm:
                CLIENT._call("CreateSession", req)
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT, what)
            self.assertIn(needle, str(cm.exception))

    def test_failed_run_leaves_state_unchanged(self):
        logits = np.zeros((2, 3), np.float32)
        with CLIENT.create_session(state_graph(), state={"s_out": "s"},
                                   params={"s": np.zeros(4, np.float32),
                                           "m": np.zeros((2, 2), np.float32)}) as s:
            one = np.arange(1, 5, dtype=np.float32)
            ok = {"x": one, "logits": logits, "labels": np.array([0, 2], np.int32)}
            out = s.run(ok)
            self.assertEqual(sorted(out), ["loss", "wide"])
            np.testing.assert_array_equal(out["wide"], np.zeros((2, 2)))  # read before the update
            np.testing.assert_array_equal(s.get_params(["s"])["s"], one)
            bad = dict(ok, labels=np.array([0, 7], np.int32))  # label 7 of 3 classes
            with self.assertRaises(kiln.KilnError) as cm:
                s.run(bad)
            self.assertIn("out of range", str(cm.exception))
            np.testing.assert_array_equal(s.get_params(["s"])["s"], one)
            out = s.run(ok)
            np.testing.assert_array_equal(out["wide"], one.reshape(2, 2))
            np.testing.assert_array_equal(s.get_params(["s"])["s"], 2 * one)
            s.set_params({"s": np.full(4, 10, np.float32)})  # reset
            s.run(ok)
            np.testing.assert_array_equal(s.get_params(["s"])["s"], 10 + one)

    def test_state_without_its_param_bound_names_it(self):
        with CLIENT.create_session(state_graph(), state={"s_out": "s"}) as s:
            with self.assertRaises(kiln.KilnError) as cm:
                s.run({"x": np.zeros(4, np.float32), "logits": np.zeros((2, 3), np.float32),
                       "labels": np.zeros(2, np.int32)})
            self.assertIn("is not given", str(cm.exception))
            self.assertIn("SetParams", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
