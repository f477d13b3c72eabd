"""The Beam Poisson job (tfdp_embed_beam) and its trainer-side reader (tfdp_embed/data/beam_shards.py).

The per-example draw and the per-step cut are checked here without Beam;
the tests marked `beam` run the job itself with the DirectRunner from the
Beam environment (.venv-beam, or $TFDP_BEAM_PYTHON; `make test-beam`) and
read its shards back. Statistical checks use 5-standard-deviation binomial
tolerances (seeds are fixed, so the tests are deterministic).
"""

from __future__ import annotations

import gzip
import json
import os
import random

import numpy as np
import pytest

from tfdp_embed.data import beam_poisson_batches, fed_batching, fixed_shape_batches
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed_beam import record_format as fmt
from tfdp_embed_beam.sampling import check_seed, cut_step, example_steps

# -- the draw, without Beam ------------------------------------------------------------------


def test_example_steps_depend_only_on_seed_and_key():
    keys = [(f, line) for f in range(3) for line in range(200)]
    draw = lambda key, seed=11: example_steps(seed, *key, sampling_probability=0.05, total_steps=100).tolist()  # noqa: E731
    in_order = {key: draw(key) for key in keys}
    # Another "bundle split": shuffled, in two halves, with unrelated draws in between.
    shuffled = random.Random(0).sample(keys, len(keys))
    split = {}
    for half in (shuffled[:250], shuffled[250:]):
        draw((9, 9), seed=5)
        split.update({key: draw(key) for key in half})
    assert split == in_order
    assert in_order[(0, 1)] != in_order[(1, 0)]  # file and line are separate words of the counter
    assert sum(draw(key, seed=12) != in_order[key] for key in keys) > 0.9 * len(keys)
    assert all(
        steps == sorted(set(steps)) and 0 <= min(steps + [0]) and max(steps + [0]) < 100 for steps in split.values()
    )
    np.testing.assert_array_equal(example_steps(1, 0, 0, sampling_probability=1.0, total_steps=4), [0, 1, 2, 3])


def test_example_steps_are_independent_bernoulli(check_poisson):
    q, steps, n = 0.05, 240, 1500  # 12 epochs of 20 steps
    m = np.zeros((steps, n), np.int64)
    for i in range(n):
        m[example_steps(3, i % 2, i // 2, sampling_probability=q, total_steps=steps), i] = 1
    check_poisson(m, q)


def test_cut_step_is_a_uniform_subset_whatever_the_member_order():
    members = [((f, line), f"line {f} {line}") for f in range(2) for line in range(5)]  # 10 members
    kept, cut = cut_step(4, 17, members, 4)
    assert len(kept) == 4 and cut == 6 and set(kept) <= set(members)
    assert cut_step(4, 17, list(reversed(members)), 4) == (kept, cut)
    everyone, none_cut = cut_step(4, 17, members, None)
    assert none_cut == 0 and sorted(everyone) == sorted(members) and everyone[:4] == kept  # cut = a prefix of one order
    assert cut_step(4, 17, members, 20) == (everyone, 0)
    # Each member is kept with probability 4/10 over steps: Binomial(3000, 0.4) per member.
    counts = {member: 0 for member in members}
    for step in range(3000):
        for member in cut_step(4, step, members, 4)[0]:
            counts[member] += 1
    sd = np.sqrt(3000 * 0.4 * 0.6)
    assert all(abs(c - 1200) < 5 * sd for c in counts.values()), counts


def test_record_format_and_bad_seeds():
    record = fmt.encode_record(123456789, 7, b"a\tb\xff")
    assert fmt.decode_record(record) == (123456789, 7, b"a\tb\xff") and len(record) == fmt.HEADER_BYTES + 4
    assert fmt.shard_of_file("000012-00003-of-00004.tfrecord") == 12
    with pytest.raises(ValueError, match="not a shard file"):
        fmt.shard_of_file("manifest.json")
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="`seed`"):
            check_seed(bad)


# -- the reader, on shards written here --------------------------------------------------------


def _write_shards(directory, batches, *, steps_per_shard, files_per_shard=2, cap=None, n=8, epochs=1):
    """Shards of `batches` (a list of line lists per step, `epochs` epochs of them), records shuffled over several
    files; the manifest."""
    os.makedirs(os.path.join(directory, fmt.SHARD_DIR))
    shards = -(-len(batches) // steps_per_shard)
    counts = [0] * shards
    rng = random.Random(1)
    for k in range(shards):
        records = [
            fmt.encode_record(t, p, line.encode())
            for t in range(k * steps_per_shard, min(len(batches), (k + 1) * steps_per_shard))
            for p, line in enumerate(batches[t])
        ]
        rng.shuffle(records)
        counts[k] = len(records)
        for j in range(files_per_shard if records else 0):
            name = f"{fmt.shard_prefix(k)}-{j:05d}-of-{files_per_shard:05d}{fmt.SHARD_SUFFIX}"
            with tf.io.TFRecordWriter(os.path.join(directory, fmt.SHARD_DIR, name)) as writer:
                for record in records[j::files_per_shard]:
                    writer.write(record)
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "sampler": fmt.SAMPLER,
        "sampling_probability": epochs / len(batches),
        "num_examples": n,
        "epochs": epochs,
        "batches_per_epoch": len(batches) // epochs,
        "steps": len(batches),
        "max_batch_size": cap,
        "seeded": True,
        "seed": 1,
        "truncated_batches": 1,
        "truncated_examples": 2,
        "records": sum(counts),
        "steps_per_shard": steps_per_shard,
        "shards": shards,
        "shard_records": counts,
    }
    with open(os.path.join(directory, fmt.MANIFEST), "w") as handle:
        handle.write(fmt.dump_manifest(manifest))
    return manifest


def test_reader_yields_each_step_in_order_and_only_once(tmp_path):
    # Steps 2, 3 and the whole shard of steps 3..5 but 5 are empty; shard 2 is the last, short one.
    batches = [["a", "b"], ["c"], [], [], [], ["d", "e", "f"], ["g"]]
    _write_shards(str(tmp_path), batches, steps_per_shard=3, cap=3)
    lines, info = beam_poisson_batches(str(tmp_path))
    assert [[x.decode() for x in b.numpy()] for b in lines] == batches  # in position order within a step
    assert info.sampler == "beam_poisson" and info.batches_per_epoch == 7 and info.steps == 7 and info.streaming
    assert info.report()["steps"] == 7
    assert info.report()["truncated_batches"] == 1 and info.report()["truncated_examples"] == 2
    assert fed_batching(lines.map(lambda x: x).prefetch(1)).verified_poisson
    with pytest.raises(tf.errors.InvalidArgumentError, match="already read"):
        next(iter(lines))


def test_reader_refuses_missing_or_foreign_records(tmp_path):
    manifest = _write_shards(str(tmp_path / "a"), [["a"], ["b", "c"]], steps_per_shard=1, files_per_shard=1)
    os.remove(tmp_path / "a" / fmt.SHARD_DIR / f"000001-00000-of-00001{fmt.SHARD_SUFFIX}")
    with pytest.raises(ValueError, match=r"Shards \[1\]"):
        beam_poisson_batches(str(tmp_path / "a"))
    _write_shards(str(tmp_path / "b"), [["a"], ["b", "c"]], steps_per_shard=1, files_per_shard=1)
    manifest["shard_records"] = [1, 3]
    with open(tmp_path / "b" / fmt.MANIFEST, "w") as handle:
        json.dump(manifest, handle)
    with pytest.raises(tf.errors.InvalidArgumentError, match="shard record count"):
        list(beam_poisson_batches(str(tmp_path / "b"))[0])
    with pytest.raises(ValueError, match="no manifest.json"):
        beam_poisson_batches(str(tmp_path))


# -- the user's code: shards -> dataset -> DPModel.fit ------------------------------------------------


def _user_dataset(directory):
    """What a user writes: the shards' lines parsed to (ids, labels), padded to the cap, prefetched."""
    lines, info = beam_poisson_batches(directory)

    def parse(batch):
        fields = tf.strings.to_number(tf.strings.split(batch, "\t").to_tensor(shape=[None, 2]), tf.int32)
        return fields[:, :1], tf.cast(fields[:, 1:], tf.float32)

    fixed, info = fixed_shape_batches(lines.map(parse), info)
    return fixed.prefetch(2), info


def _dp_model(info):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((1,), dtype="int32")
    logits = keras.layers.Dense(1)(DPEmbedding(8, 2, combiner="sum")(inputs))
    dp = DPModel(
        keras.Model(inputs, logits),
        mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3),
        expected_batch_size=info.expected_batch_size,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return dp


@pytest.mark.parametrize("prepare_first", [False, True])
def test_fit_trains_on_every_step_of_the_shards_once(tmp_path, prepare_first):
    # 2 epochs of 6 steps; fit's look at the first batches (build, contract check) must not use up the pass.
    batches = [[f"{(3 * t + j) % 8}\t{j % 2}" for j in range(t % 3 + 1)] for t in range(12)]
    _write_shards(str(tmp_path), batches, steps_per_shard=5, cap=3, epochs=2)
    dataset, info = _user_dataset(str(tmp_path))
    assert (info.steps, info.batches_per_epoch) == (12, 6)
    dp = _dp_model(info)
    if prepare_first:
        dp.prepare(dataset)
    epochs = info.steps // info.batches_per_epoch
    history = dp.fit(dataset, epochs=epochs, steps_per_epoch=info.batches_per_epoch, verbose=0)
    assert int(dp.optimizer.iterations.numpy()) == 12 and len(history.history["loss"]) == 2
    assert dp.batching.verified_poisson and dp.batching.info.steps == 12
    # A second pass over the same Poisson draws is still refused: by the same model, and by a new one.
    with pytest.raises(tf.errors.InvalidArgumentError, match="already read"):
        dp.fit(dataset, epochs=1, steps_per_epoch=6, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="already read"):
        _dp_model(info).fit(dataset, epochs=1, steps_per_epoch=6, verbose=0)


# -- the Beam job (DirectRunner, in the Beam environment) -------------------------------------------

N, Q, EPOCHS, CAP = 300, 0.05, 12, 15


def _line(i: int) -> str:
    return f"{i}\t{2 * i}\tpayload é {i}"


@pytest.fixture(scope="module")
def job_outputs(tmp_path_factory, beam_job):
    """Runs the job on 300 lines in 3 files (one gzipped), same seed: uncapped, capped at 15, and uncapped again
    with 3 worker threads (other bundles)."""
    inputs = tmp_path_factory.mktemp("inputs")
    for f in range(3):
        text = "".join(_line(100 * f + j) + "\n" for j in range(100))
        if f == 2:
            with gzip.open(inputs / "part2.tsv.gz", "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            (inputs / f"part{f}.tsv").write_text(text, encoding="utf-8")
    outputs = {}
    threads = ["--direct_num_workers", "3", "--direct_running_mode", "multi_threading"]
    for name, cap, runner_args in (("full", None, []), ("capped", CAP, []), ("threads", None, threads)):
        out = tmp_path_factory.mktemp(name) / "poisson"
        command = ["--input", str(inputs / "part*"), "--output", str(out)]
        command += [
            "--sampling_probability",
            str(Q),
            "--epochs",
            str(EPOCHS),
            "--seed",
            "7",
            "--records_per_shard",
            "60",
        ]
        command += (["--max_batch_size", str(cap)] if cap else []) + runner_args
        done = beam_job(command)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[name] = str(out)
    outputs["command"] = command
    return outputs


def _membership(lines):
    """[steps, N] 0/1 matrix; every line must come back intact, at most once per step."""
    rows = []
    for batch in lines:
        decoded = [x.decode() for x in batch.numpy()]
        ids = [int(x.split("\t")[0]) for x in decoded]
        assert decoded == [_line(i) for i in ids] and len(set(ids)) == len(ids)
        row = np.zeros(N, np.int64)
        row[ids] = 1
        rows.append(row)
    return np.array(rows)


@pytest.mark.beam
def test_beam_job_batches_are_poisson(job_outputs, check_poisson):
    lines, info = beam_poisson_batches(job_outputs["full"])
    manifest = json.load(open(os.path.join(job_outputs["full"], fmt.MANIFEST)))
    assert manifest["num_examples"] == N and manifest["steps"] == EPOCHS * 20
    assert manifest["seeded"] and "seed" not in manifest  # whoever knows the seed recomputes every batch
    assert manifest["steps_per_shard"] == 4 and manifest["shards"] == 60  # 60 // (q N = 15) steps per shard
    assert info.sampler == "beam_poisson" and info.batches_per_epoch == 20 and info.num_examples == N
    m = _membership(lines)
    assert m.shape == (EPOCHS * 20, N) and m.sum() == manifest["records"]
    check_poisson(m, Q)
    assert fed_batching(lines.prefetch(1)).verified_poisson


@pytest.mark.beam
def test_beam_job_output_does_not_depend_on_bundles(job_outputs):
    full, threads = (beam_poisson_batches(job_outputs[name])[0] for name in ("full", "threads"))
    assert [b.numpy().tolist() for b in threads] == [b.numpy().tolist() for b in full]  # same lines, same order


@pytest.mark.beam
def test_beam_job_truncates_to_a_counted_subset(job_outputs):
    full = _membership(beam_poisson_batches(job_outputs["full"])[0])
    lines, info = beam_poisson_batches(job_outputs["capped"])
    cut = _membership(lines)
    sizes = full.sum(1)  # the same seed draws the same steps; the cap only cuts
    np.testing.assert_array_equal(cut.sum(1), np.minimum(sizes, CAP))
    assert np.all(cut <= full)
    assert info.report()["truncated_batches"] == int((sizes > CAP).sum()) > 0
    assert info.report()["truncated_examples"] == int(np.maximum(sizes - CAP, 0).sum())


@pytest.mark.beam
def test_beam_job_batches_pad_to_a_fixed_shape(job_outputs):
    lines, info = beam_poisson_batches(job_outputs["capped"])

    def parse(batch):
        fields = tf.strings.split(batch, "\t").to_tensor(shape=[None, 3])
        return {"id": tf.strings.to_number(fields[:, 0], tf.int64)}, tf.strings.to_number(fields[:, 1])

    fixed, fixed_info = fixed_shape_batches(lines.map(parse), info)
    assert fixed_info.sampler == "beam_poisson" and fed_batching(fixed).info is fixed_info
    for features, labels, weights in fixed.take(40):
        k = int(weights.numpy().sum())
        assert features["id"].shape == [CAP] and not labels.numpy()[k:].any()
        np.testing.assert_array_equal(labels.numpy()[:k], 2 * features["id"].numpy()[:k])


@pytest.mark.beam
def test_beam_job_refuses_an_output_that_holds_shards(job_outputs, beam_job):
    done = beam_job(job_outputs["command"])  # the last run's command again: its output holds shards
    assert done.returncode != 0 and "already holds shards" in done.stderr
