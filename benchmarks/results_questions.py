"""The questions `benchmarks/RESULTS.md` answers: which runs each reads and which fields its table shows.

One `Question` per section: a title, what it answers (1-3 sentences), the benchmarks it reads, and `build`,
which picks the latest matching run(s) from `benchmarks/results/` and returns them with the section's table.
A benchmark with no question here still appears on the page, under "Other benchmarks" (its latest run).
Every number is read from a JSON file; nothing here is a measurement.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from benchmarks.results_page import latest, link, table

MECHANISM_ORDER = (
    "none",
    "dpmodel_none",
    "eana",
    "lazy",
    "lazy_lookahead",
    "fest",
    "adafest",
    "adafest@1000",
    "adafest+",
)
PEERS = ("dense", "tfp_keras_sgd")
NOT_DP = {"eana": "eana (not DP)", "none": "none (non-private)"}


@dataclasses.dataclass(frozen=True)
class Question:
    title: str
    text: str
    benchmarks: tuple
    build: Callable  # runs -> (runs used, Markdown body) or None


# -- formatting -------------------------------------------------------------------
def times(value) -> str:
    return "not measured" if value is None else (f"{value:,.0f}×" if value >= 100 else f"{value:.2f}×")


def ms(seconds) -> str:
    return "not measured" if seconds is None else f"{seconds * 1000:.2f} ms"


def gib(size_bytes) -> str:
    return f"{size_bytes / 2**30:.2f} GiB" if size_bytes else "not measured"


def power(vocab) -> str:
    exponent = len(str(int(vocab))) - 1
    mantissa = int(vocab) / 10**exponent
    sup = str(exponent).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    return f"10{sup}" if mantissa == 1 else f"{mantissa:g}·10{sup}"


def num(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def ordered(names) -> list[str]:
    known = [m for m in (*MECHANISM_ORDER, *PEERS) if m in names]
    return known + sorted(set(names) - set(known))


# -- step time ---------------------------------------------------------------------
def tf_keras_only(doc) -> bool:
    """A step_time run of tf-keras alone (`--front-end keras2`, the default; runs before the flag)."""
    return (doc.get("settings") or {}).get("front_end", "keras2") == "keras2"


def step_cells(runs, *, dim: int, min_repeats: int = 1, zipf=None) -> dict:
    """(mechanism, vocab) -> (result row, run): the latest tf-keras step_time result at this `dim` and `zipf`
    (None: uniform); `--front-end` comparisons have their own question."""
    cells: dict = {}
    for run in runs:
        settings = run.doc.get("settings") or {}
        if run.benchmark != "step_time" or settings.get("dim") != dim or settings.get("zipf") != zipf:
            continue
        if not tf_keras_only(run.doc):
            continue
        if (settings.get("repeats") or 1) < min_repeats:
            continue
        for row in run.doc.get("results", []):
            if row.get("ratio_to_none") is not None and row.get("vocab"):
                cells[(row["mechanism"], int(row["vocab"]))] = (row, run)
    return cells


def _cell_table(cells, *, with_processes: bool = False):
    vocabs = sorted({vocab for _, vocab in cells})
    rows, used = [], []
    for mechanism in ordered({m for m, _ in cells}):
        picked = [cells.get((mechanism, v)) for v in vocabs]
        row = [f"`{mechanism}`" + (" (not DP)" if mechanism == "eana" else "")]
        for cell in picked:
            if cell is None:
                row.append("not measured")
            elif mechanism == "none":
                row.append(f"{ms(cell[0].get('median_step_s'))} (median)")
            else:
                runs_ratio = cell[0].get("ratio_to_none_runs") or []
                spread = ", ".join(f"{r:.2f}" for r in runs_ratio) if with_processes and len(runs_ratio) > 1 else ""
                row.append(times(cell[0]["ratio_to_none"]) + (f" ({spread})" if spread else ""))
        dates = sorted({cell[1].short_date for cell in picked if cell})
        used += [cell[1] for cell in picked if cell and cell[1] not in used]
        rows.append([*row, ", ".join(dates)])
    header = ["mechanism", *[f"{power(v)} rows" for v in vocabs], "run"]
    return sorted(set(used), key=lambda run: run.date), table(header, rows, "l" + "r" * len(vocabs) + "l")


def build_sweep(runs):
    cells = step_cells(runs, dim=64)
    if not cells:
        return None
    used, body = _cell_table(cells)
    return used, "DP step ÷ non-private step (same process), `vocab × 64` table, uniform ids.\n\n" + body


def build_zipf(runs):
    cells = step_cells(runs, dim=64, zipf=1.1)
    if not cells:
        return None
    used, body = _cell_table(cells)
    return used, "DP step ÷ non-private step (same process), `vocab × 64` table, Zipf ids (a = 1.1).\n\n" + body


def build_scale(runs):
    cells = step_cells(runs, dim=16, min_repeats=3)
    if not cells:
        return None
    used, body = _cell_table(cells, with_processes=True)
    return used, "DP step ÷ non-private step, median over processes (each process's ratio in brackets).\n\n" + body


def build_peers(runs):
    def has_dense(doc):
        return tf_keras_only(doc) and any(s.get("dense_over_mechanism") for s in doc.get("speedups_vs_dense") or [])

    run = latest(runs, "step_time", where=has_dense)
    if run is None:
        return None
    rows = [
        [
            f"`{s['mechanism']}`",
            power(s["vocab"]),
            ms(s["median_step_s"]),
            times(s.get("dense_over_mechanism")),
            times(s.get("tfp_keras_sgd_over_mechanism")),
        ]
        for s in run.doc["speedups_vs_dense"]
    ]
    header = ["mechanism", "rows", "median step", "dense ÷ mechanism", "tensorflow-privacy ÷ mechanism"]
    return [run], table(header, rows)


def front_end_cells(runs) -> dict:
    """(mechanism, vocab) -> (comparison entry, run): the latest `--front-end both` entry measured under both."""
    cells: dict = {}
    for run in runs:
        if run.benchmark != "step_time":
            continue
        for entry in run.doc.get("front_end_comparison") or []:
            if entry.get("keras3_over_keras2") is not None:
                cells[(entry["mechanism"], int(entry["vocab"]))] = (entry, run)
    return cells


def _front_end_row(entry: dict, run) -> list:
    per_repeat = entry.get("keras3_over_keras2_runs") or []
    spread = f" ({', '.join(f'{r:.2f}' for r in per_repeat)})" if len(per_repeat) > 1 else ""
    return [
        f"`{entry['mechanism']}`" + (" (not DP)" if entry["mechanism"] == "eana" else ""),
        power(entry["vocab"]),
        ms(entry["keras2_median_step_s"]),
        ms(entry["keras3_median_step_s"]),
        times(entry["keras3_over_keras2"]) + spread,
        times(entry.get("keras3_over_keras2_cpu")),
        times(entry.get("plain_keras3_over_keras2")),
        f"{times(entry.get('keras2_ratio_to_none'))} / {times(entry.get('keras3_ratio_to_none'))}",
        f"{gib((entry.get('keras2_peak_rss_mb') or 0) * 2**20)} / {gib((entry.get('keras3_peak_rss_mb') or 0) * 2**20)}",
        f"{run.short_date} ({(run.doc.get('settings') or {}).get('pairing', 'processes')})",
    ]


def build_front_ends(runs):
    cells = front_end_cells(runs)
    if not cells:
        return None
    vocabs = sorted({vocab for _, vocab in cells})
    rows, used = [], []
    for vocab in vocabs:
        for mechanism in ordered({m for m, v in cells if v == vocab}):
            entry, run = cells[(mechanism, vocab)]
            rows.append(_front_end_row(entry, run))
            used += [run] if run not in used else []
    header = [
        "mechanism",
        "rows",
        "tf-keras step",
        "Keras 3 step",
        "Keras 3 ÷ tf-keras (per repeat)",
        "same, CPU time",
        "plain step, Keras 3 ÷ tf-keras",
        "DP ÷ non-private, tf-keras / Keras 3",
        "peak RSS, tf-keras / Keras 3",
        "run",
    ]
    intro = (
        "Medians over repeats; Keras 3 ÷ tf-keras is the median of each repeat's ratio (the run's `--pairing`, "
        "after its date: `steps`, both front ends in one process with their steps alternated; `processes`, two "
        "back-to-back processes). The plain step is the one timed beside each DP step on the same model; for "
        "`none` it is `keras.layers.Embedding`'s step under each Keras (Keras 3's reads the whole table through "
        "`ops.take`, so the in-place update copies the table each step; `dpmodel_none`, DPEmbedding without noise, "
        "is the fast non-private step under both). Peak RSS is the maximum over processes "
        "(with `steps`: VmHWM reset before building each front end, the other one's model resident when it was "
        "built second).\n\n"
    )
    return sorted(used, key=lambda run: run.date), intro + table(header, rows, "lrrrrrrrrl")


# -- end to end, input pipeline ----------------------------------------------------------
def build_end_to_end(runs):
    run = latest(runs, "end_to_end", where=lambda doc: len(doc.get("summary") or {}) >= 4)
    if run is None:
        return None
    summary = run.doc["summary"]
    base = summary.get("none") or {}
    rows = []
    for mechanism in ordered(summary):
        entry = summary[mechanism]
        rows.append(
            [
                NOT_DP.get(mechanism, mechanism),
                f"{times(entry['wall_s'] / base['wall_s'])} ({entry['wall_s']:.1f} s)" if base else "not measured",
                times(entry["median_step_s"] / base["median_step_s"]) if base else "not measured",
                f"{entry.get('stages', {}).get('first step', 0):.1f} s",
                gib(entry.get("peak_rss_bytes")),
                str(entry.get("runs", "")),
            ]
        )
    header = ["mechanism", "wall ÷ none", "median step ÷ none", "first step", "peak RSS", "runs"]
    return [run], table(header, rows)


def build_streaming(runs):
    run = latest(runs, "streaming")
    if run is None:
        return None
    rows = [
        [
            f"{s['rows']:,}",
            s["method"],
            f"{s['rows_per_s']:,.0f}",
            times(s["ratio_to_plain"]),
            str(s.get("passes", "")),
            gib(s.get("process_peak_rss_bytes")),
        ]
        for s in run.doc["summary"]
    ]
    return [run], table(["rows", "method", "rows/s", "÷ plain read", "file reads", "peak RSS"], rows, "llrrrr")


# -- utility -------------------------------------------------------------------------
def build_criteo(runs):
    run = latest(runs, "criteo_realdata")
    if run is None:
        return None
    epsilons = sorted({r["target_epsilon"] for r in run.doc["runs"] if r["target_epsilon"] is not None})
    cells = {(r["mechanism"], r["target_epsilon"]): r for r in run.doc["runs"]}
    rows = []
    for mechanism in ordered({r["mechanism"] for r in run.doc["runs"]}):
        targets = [None] if mechanism == "none" else epsilons
        values = [cells.get((mechanism, e)) for e in targets]
        shown = [f"{r['auc']:.3f} / {r['logloss']:.3f}" if r else "" for r in values]
        rows.append([NOT_DP.get(mechanism, mechanism), *(shown + [""] * (len(epsilons) - len(shown)))])
    header = ["mechanism (AUC / log loss)", *[f"ε = {e:g}" for e in epsilons]]
    return [run], table(header, rows)


def _fest_cell(pick) -> str:
    best = pick.get("best")
    if best:
        return f"{best['gradient_size_reduction']:,.1f}× (AUC {best['auc']:.3f})"
    return f"none (best AUC {num((pick.get('private') or {}).get('auc'))})"


def build_fest(runs):
    prefixes = ("fest_tradeoff-real", "fest_tradeoff-syn")
    used = [r for r in (latest(runs, "fest_tradeoff", prefix=p) for p in prefixes) if r]
    if not used:
        return None
    cells: dict = {}
    losses: list = []
    for run in used:
        data = "real sample" if "-real" in run.name else "synthetic"
        for pick in run.doc.get("picks", []):
            key = (data, pick["mechanism"], pick["epsilon"], pick["lazy_auc"])
            cells.setdefault(key, {})[pick["loss"]] = _fest_cell(pick)
            losses += [] if pick["loss"] in losses else [pick["loss"]]
    rows = [
        [data, mechanism, f"{eps:g}", num(lazy_auc), *[found.get(loss, "not measured") for loss in losses]]
        for (data, mechanism, eps, lazy_auc), found in cells.items()
    ]
    header = ["data", "mechanism", "ε", "LazyDP AUC", *[f"reduction within AUC loss {loss:g}" for loss in losses]]
    intro = "Largest gradient-size reduction over LazyDP whose AUC is within the loss allowed.\n\n"
    return used, intro + table(header, rows, "lllr" + "r" * len(losses))


def build_movielens(runs):
    run = latest(runs, "movielens_utility")
    if run is None:
        return None
    rows = [
        [
            NOT_DP.get(r["mechanism"], r["mechanism"]),
            num(r.get("epsilon"), 2),
            f"{r['noise_multiplier']:.3g}",
            num(r["precision@10"], 4),
            num(r["recall@10"], 4),
            num(r["recall@20"], 4),
            f"{r['median_step_ms']:.1f} ms",
        ]
        for r in run.doc["runs"]
    ]
    body = table(["mechanism", "ε", "σ", "P@10", "R@10", "R@20", "median step"], rows)
    user_level = latest(runs, "movielens_user_level")  # issue 30: the same model, the user as the privacy unit
    if user_level is None:
        return [run], body
    return [run, user_level], body + "\n\n**User level.** " + user_level_text(user_level.doc)


def user_level_text(doc: dict) -> str:
    """The user-level section: its table and what it says, computed from the runs (nothing worded by hand)."""
    runs, config = doc["runs"], doc["config"]
    none = next(r for r in runs if r["run"] == "none")
    ks = [int(k) for k in str(config["ks"]).split(",")]
    rows, costs, best_ks = [], [], []
    batches = sorted({r["batch_size"] for r in runs if r["privacy_unit"] == "user"})
    for eps in sorted({float(e) for e in str(config["epsilons"]).split(",")}):
        near = [r for r in runs if r["epsilon"] is not None and abs(r["epsilon"] - eps) < 0.01 * eps]
        example = next((r for r in near if r["run"] == "example"), None)
        users = {(r["k"], r["batch_size"]): r for r in near if r["privacy_unit"] == "user"}
        if example is None or not users:
            continue
        best = max(users.values(), key=lambda r: r["recall@10"])
        best_ks.append((best["k"], best["batch_size"]))
        costs.append((eps, example["recall@10"], best["recall@10"]))
        group = f"{example['group_epsilon_median_user']:.3g} / {example['group_epsilon_largest_user']:.3g}"
        cells = [" / ".join(num(users[k, b]["recall@10"], 4) if (k, b) in users else "—" for b in batches) for k in ks]
        rows.append([f"{eps:g}", num(example["recall@10"], 4), group, *cells])
    header = ["ε", "example level R@10", "its ε for a median / largest user"]
    header += [f"user level k={k} R@10 ({' / '.join(map(str, batches))} users per batch)" for k in ks]
    return _user_level_intro(doc, none) + table(header, rows) + _user_level_findings(costs, best_ks, none)


def _user_level_intro(doc: dict, none: dict) -> str:
    c, runs = doc["config"], doc["runs"]
    example = next(r for r in runs if r["run"] == "example")
    steps = ", ".join(
        f"{r['steps']} with {r['batch_size']}"
        for r in {r["batch_size"]: r for r in runs if r["privacy_unit"] == "user"}.values()
    )
    user = next(r for r in runs if r["privacy_unit"] == "user")
    return (
        f"ml-100k two-tower, DP-SGD, δ = {c['delta']:g} for every DP run, {c['epochs']} epochs (passes over the "
        f"units: {example['steps']} steps at example level with {c['batch_size']} examples per batch; at user level "
        f"{steps} of {user['num_units']} users per batch), the pipeline's learning rate for calibrated runs, one "
        f"seed. Non-private recall@10 {none['recall@10']:.4f}; popularity (training counts, not private) "
        f"{none['popularity_recall@10']:.4f}. The example-level ε is per (context, label) example; the column beside "
        f"it gives the group-privacy ε (`tfdp_embed.accounting.group_epsilon`, a loose upper bound) for a user with "
        f"{example['median_user_examples']} (median) and {example['largest_user_examples']} (most) examples.\n\n"
    )


def _user_level_findings(costs: list, best_ks: list, none: dict) -> str:
    if not costs:
        return ""
    lines = [
        f"at ε = {eps:g} the best user-level run reaches {user:.4f} against example level's {example:.4f} "
        f"({user / example:.0%} of it)"
        for eps, example, user in costs
    ]
    above = sum(1 for _, _, user in costs if user > none["popularity_recall@10"])
    best = max(set(best_ks), key=best_ks.count)
    return (
        "\n\nWhat user-level privacy costs: " + "; ".join(lines) + f" (non-private {none['recall@10']:.4f}). The "
        f"best user-level run beats the popularity ranking at {above} of {len(costs)} ε. The best k (and users per "
        f"batch) on the test split is k = {best[0]} ({best[1]} users per batch) at {best_ks.count(best)} of "
        f"{len(best_ks)} ε; choosing k or the batch by test recall is not private and not accounted (it is "
        "optimistic): a release picks them from public knowledge or pays for a private selection."
    )


def _same_model_ratio(row: dict, rows: list) -> str:
    """A DP run's median step ÷ the non-private run of the same model and negatives ("—" without one)."""
    control = [r for r in rows if r["mechanism"] == "none" and r["negatives"] == row["negatives"]]
    if row["mechanism"] == "none" or not control:
        return "—"
    return times(row["median_step_ms"] / control[0]["median_step_ms"])


def _interleaved_text(side: dict) -> str:
    return (
        f"\n\nSide by side in one process ({side['steps']} alternating steps, mean batch {side['mean_batch']:.0f}, "
        f"{side['negatives']}, 1-min load {side['load_average'][0]:.1f} at start): DP {side['mechanism']} "
        f"{side['dp']['wall_ms']:.1f} ms wall / {side['dp']['cpu_ms']:.1f} ms CPU per step vs non-private same "
        f"model {side['none']['wall_ms']:.1f} / {side['none']['cpu_ms']:.1f} ms: **{times(side['wall_ratio'])} wall, "
        f"{times(side['cpu_ratio'])} CPU**."
    )


def _retrieval_intro(doc: dict) -> str:
    """The recipe and the protocol of a `benchmarks.retrieval` run (empty for runs before the recipe)."""
    recipe = doc.get("recipe")
    if not recipe:
        return ""
    decay = ", cosine-decayed to 0" if recipe["cosine_decay"] else ""
    return (
        f"ml-100k, a random 80/20 split of the ratings. DP runs and their same-model non-private controls use "
        f"`RetrievalRecipe`'s settings: SGD {recipe['learning_rate']:g}{decay}, {recipe['epochs']} epochs of "
        f"Poisson batches (expected {recipe['batch_size']}), clip 1, ε {num(doc['args'].get('epsilon'), 0)} "
        "(σ calibrated per mechanism, RDP, δ = 1/N). recall@k ranks every movie for each test rating (ties "
        "against the positive); 'unrated' ranks only the movies the user did not rate in training."
    )


def _retrieval_comparison(rows: list) -> list:
    """One sentence: the DP runs' recall@10 beside popularity, tuned TFRS and the non-private controls."""
    by_kind = {
        "DP": [r["recall@10"] for r in rows if r.get("epsilon") is not None],
        "non-private controls": [
            r["recall@10"] for r in rows if r["mechanism"] == "none" and r["negatives"] != "in-batch"
        ],
        "TFRS": [r["recall@10"] for r in rows if r["negatives"] == "in-batch"],
        "popularity": [r["recall@10"] for r in rows if r["mechanism"] == "popularity"],
    }
    if not all(by_kind.values()):
        return []
    span = {kind: f"{min(v):.4f}" + (f"–{max(v):.4f}" if max(v) > min(v) else "") for kind, v in by_kind.items()}
    return [
        f"recall@10: DP runs {span['DP']}, most popular movies {span['popularity']}, tuned TFRS {span['TFRS']}, "
        f"same-model non-private controls {span['non-private controls']}."
    ]


def build_retrieval(runs):
    run = latest(runs, "retrieval")
    if run is None:
        return None
    rows = [
        [
            r["run"],
            num(r.get("epsilon"), 2),
            num(r["recall@10"], 4),
            num(r["recall@50"], 4),
            num(r.get("recall@10 unrated"), 4),
            "—" if r["median_step_ms"] is None else f"{r['median_step_ms']:.1f} ms",
            _same_model_ratio(r, run.doc["runs"]),
        ]
        for r in run.doc["runs"]
    ]
    header = ["run", "ε", "recall@10", "recall@50", "recall@10 unrated", "median step", "step ÷ same-model non-private"]
    # One paragraph under the table (the page is kept short): protocol, DP gaps, tuning, comparison, step ratio.
    found = [_retrieval_intro(run.doc), *(run.doc.get("notes") or []), *_retrieval_comparison(run.doc["runs"])]
    side = run.doc.get("interleaved")
    step = latest(runs, "retrieval_step")
    sides = [_interleaved_text(side).strip() if side else "", _retrieval_step_text(step.doc) if step else ""]
    text = " ".join(part for part in [*found, *sides] if part)
    used = [run] + ([step] if step else [])
    return used, table(header, rows).rstrip("\n") + ("\n\n" + text if text.strip() else "") + "\n"


def _retrieval_step_text(doc: dict) -> str:
    """`benchmarks.retrieval_step`: a mechanism and its references stepped in one rotation with the non-private step."""
    r = doc["result"]
    parts = [(r["mechanism"], r["dp"], r["wall_ratio"], r["cpu_ratio"])]
    parts += [(name, ref, ref["wall_ratio"], ref["cpu_ratio"]) for name, ref in (r.get("references") or {}).items()]
    each = "; ".join(
        f"DP {name} {t['wall_ms']:.1f} / {t['cpu_ms']:.1f} ms: **{times(w)} wall, {times(c)} CPU**"
        for name, t, w, c in parts
    )
    return (
        f"Stepped in one rotation (`benchmarks.retrieval_step`, {r['steps']} steps each, mean batch "
        f"{r['mean_batch']:.0f}, {r['negatives']}, 1-min load {r['load_average'][0]:.1f}): non-private same model "
        f"{r['none']['wall_ms']:.1f} ms wall / {r['none']['cpu_ms']:.1f} ms CPU; {each}."
    )


def build_keras3_two_tower(runs):
    run = latest(runs, "keras3_two_tower", where=lambda doc: not (doc.get("settings") or {}).get("quick"))
    if run is None:
        return None
    rows = [
        [
            f"{r['run']} (`{r['mechanism']}`)",
            num(r.get("epsilon"), 2),
            f"{r['noise_multiplier']:.3g}",
            num(r["recall@10"], 4),
            f"{r['train_s']:.0f} s",
        ]
        for r in run.doc["runs"]
    ]
    rows.append(["most-popular movies (non-private)", "—", "—", num(run.doc["recall@10_popularity"], 4), "—"])
    s = run.doc["settings"]
    intro = (
        f"ml-100k, a random 80/20 split of the ratings (unit: one rating); {s['epochs']} epochs of Poisson "
        f"batches (q N~ = {s['batch_size']}, {s['steps']} steps), SGD {s['learning_rate']:g} with momentum 0.9 "
        f"for both runs, δ = {run.doc['delta']:.3g}; recall@10 ranks the movies the user did not rate in "
        f"training (`keras_rs.metrics.RecallAtK`). Whole run {run.doc['wall_s']:.0f} s.\n\n"
    )
    return [run], intro + table(["run", "ε", "σ", "recall@10", "training"], rows)


def build_dpformer(runs):
    used = [
        r
        for r in (
            latest(runs, "dpformer_table2", prefix=p) for p in ("dpformer_table2-eps8-5", "dpformer_table2-eps8-ep")
        )
        if r
    ]
    if not used:
        return None
    rows = []
    for run in used:
        epochs = (run.doc.get("settings") or {}).get("epochs")
        for r in run.doc["rows"]:
            paper = f"{r['paper_ndcg@10_pct']:.2f}" if r.get("paper_ndcg@10_pct") is not None else "—"
            seed = r.get("seed", "")
            rows.append(
                [
                    f"{epochs}",
                    r["model"],
                    f"{seed}",
                    r["epsilon_target"],
                    f"{r['ndcg@10_pct']:.2f} / {r['hit@10_pct']:.2f}",
                    paper,
                ]
            )
        pop = run.doc.get("popularity") or {}
        if pop:
            rows.append(
                [
                    f"{epochs}",
                    "popularity (non-private)",
                    "",
                    "—",
                    f"{pop['ndcg@10_pct']:.2f} / {pop['hit@10_pct']:.2f}",
                    "—",
                ]
            )
    header = ["epochs", "model", "seed", "ε", "NDCG@10 / HIT@10 (%)", "paper NDCG@10"]
    return used, table(header, rows, "lllrrr")


# -- privacy audit, memory, mechanics ---------------------------------------------------
def build_secret_sharer(runs):
    run = latest(runs, "secret_sharer")
    if run is None:
        return None
    counts = sorted({int(c) for r in run.doc["runs"] for c in r["exposure"]["by_insertion_count"]})
    rows = []
    for r in run.doc["runs"]:
        by = r["exposure"]["by_insertion_count"]
        exposure = [f"{by[str(c)]['mean_exposure']:.2f}" if str(c) in by else "" for c in counts]
        epsilon = r.get("epsilon")
        rows.append(
            [
                r["setting"],
                "—" if epsilon is None else f"{epsilon:.3g}",
                *exposure,
                f"{r['control']['mean_exposure']:.2f}",
            ]
        )
    header = ["run", "ε", *[f"×{c}" for c in counts], "control"]
    return [run], "Mean rank exposure (bits) of canaries inserted ×k times.\n\n" + table(header, rows)


def _canary_kind(doc) -> str:
    return doc["config"].get("canary_kind", "rare-id")


def _audited_model(doc) -> str:
    return doc["config"].get("model", "ctr")


def _ctr_tables(doc) -> tuple:
    """The real rows of the audited CTR model's tables (runs before `--tables` used the small ones)."""
    return tuple(doc["config"].get("vocab_sizes", (200, 50, 20)))


def _rare_id_ctr(doc) -> bool:
    return _canary_kind(doc) == "rare-id" and _audited_model(doc) == "ctr"


def _beside_panda(used) -> str:
    """The rare-id bounds at claimed ε = 4 beside Panda et al.'s black-box ε_lb ≈ 1 for language models."""
    at_four = [
        b
        for run in used
        for s in run.doc["settings"]
        if s["claimed_epsilon"] == 4 and s["mechanism"] not in NOT_DP
        for b in s["epsilon_lb"]
    ]
    if not at_four:
        return ""
    return (
        f"At claimed ε = 4 the rare-id canaries prove at most {max(at_four):.2f} (median {sorted(at_four)[len(at_four) // 2]:.2f}) "
        "over every DP mechanism and run, against ε_lb ≈ 1 at ε = 4 with designed canaries in language models "
        '(Panda et al., "Privacy Auditing of Large Language Models", ICLR 2025): the strongest black-box rare-id '
        f"run here reaches {max(at_four):.0%} of that bound."
    )


def _above_dense(used) -> str:
    """How much higher EANA's and the non-private run's median bounds are than dense DP-SGD's at the top ε."""
    parts = []
    for run in used:
        top = max(run.doc["config"]["epsilons"])
        median = {(s["mechanism"], s["claimed_epsilon"]): s["epsilon_lb_median"] for s in run.doc["settings"]}
        dense = median.get(("dense", top))
        if dense is None:
            continue
        gaps = [f"{name} {median[(name, None)] - dense:+.2f}" for name in ("eana", "none") if (name, None) in median]
        label = " / ".join(f"{v:,}" for v in _ctr_tables(run.doc))
        parts.append(f"tables {label}: " + ", ".join(gaps))
    if not parts:
        return ""
    return (
        "Median bound above dense DP-SGD's at the largest claimed ε (EANA runs at that σ; none adds no noise): "
        + "; ".join(parts)
        + "."
    )


def build_privacy_audit(runs):
    """The latest rare-id CTR run of each table size: one row per mechanism and ε, one bound column per size."""
    sizes = sorted({_ctr_tables(r.doc) for r in runs if r.benchmark == "privacy_audit" and _rare_id_ctr(r.doc)})
    used = [latest(runs, "privacy_audit", where=lambda d, v=v: _rare_id_ctr(d) and _ctr_tables(d) == v) for v in sizes]
    if not used:
        return None
    cells: dict = {}  # (mechanism, claimed ε, σ) -> {run index: bounds}
    for i, run in enumerate(used):
        for s in run.doc["settings"]:
            key = (s["mechanism"], s["claimed_epsilon"], f"{s['noise_multiplier']:.3g}")
            cells.setdefault(key, {})[i] = ", ".join(f"{b:.2f}" for b in s["epsilon_lb"])
    rows = [
        [NOT_DP.get(name, name), "—" if eps is None else f"{eps:g}", sigma, *(by.get(i, "—") for i in range(len(used)))]
        for (name, eps, sigma), by in cells.items()
    ]
    labels = [" / ".join(f"{v:,}" for v in _ctr_tables(run.doc)) for run in used]
    header = ["mechanism", "claimed ε", "σ", *(f"ε lower bound (95 %), each run: tables {t}" for t in labels)]
    notes = [
        f"Tables {t} (real rows of C1 / C2 / C3): with m = {run.doc['config']['num_canaries']} canaries no outcome "
        f"proves more than ε = {run.doc['max_provable_epsilon']:.2f}; correct guesses per run in its JSON."
        for t, run in zip(labels, used)
    ]
    notes += [flag for run in used for flag in run.doc["flags"]]
    notes.append(_beside_panda(used))
    notes.append(_above_dense(used))
    flagged = any(run.doc["flags"] for run in used)
    closing = "" if flagged else "\n\nNo DP mechanism's bound exceeded its claimed ε."
    return used, table(header, rows, "lrr" + "r" * len(used)) + "\n\n" + "\n".join(notes) + closing


def build_privacy_audit_white_box(runs):
    """The latest white-box run of each audited model (the CTR table, the two-tower's scored item table)."""
    used = [
        latest(runs, "privacy_audit", where=lambda d, m=m: _canary_kind(d) == "white-box" and _audited_model(d) == m)
        for m in _MODELS
    ]
    used = [run for run in used if run is not None]
    if not used:
        return None
    rows = [_white_box_row(run.doc, s) for run in used for s in run.doc["settings"]]
    header = ["model", "mechanism", "observed", "claimed ε", "run's ε (PLD)", "σ", "ε lower bound (95 %), each run"]
    body = table([*header, "bound / claimed ε"], rows)
    config = used[0].doc["config"]
    setup = (
        f"{config['num_canaries']} Dirac gradient canaries through the mechanism's noising, q = "
        f"{config['sampling_probability']}, T = {config['steps']}; observed: each step's noised update, or the "
        "table released after T SGD steps (flushed; each canary's lookup passed to the mechanism); the tightest "
        "of Steinke et al. and the f-DP analyses (Mahloujifar et al. 2025), 95 % over all tests. Run's ε: the "
        "run's events composed by PLD (with a selection, below the claimed ε's basic composition). Target "
        "(issue 31): ≥ 0.5·ε at ε = 8 for dense DP-SGD. Two-tower: the canaries sit in its item table, which the "
        "full softmax scores against every query, so every row is in every step's gradient "
        '(`--model two-tower`, `where="scored-table"`; DP-FEST and AdaFEST+ refuse such a table).\n\n'
    )
    notes = [
        f"{_MODELS[_audited_model(run.doc)]}: with m = {run.doc['config']['num_canaries']} canaries no outcome proves "
        f"more than ε = {run.doc['max_provable_epsilon']:.2f}.{_white_box_eana_gap(run.doc)}"
        for run in used
    ]
    flags = [flag for run in used for flag in run.doc["flags"]] or ["No DP mechanism's bound exceeded its claimed ε."]
    return used, setup + body + "\n\n" + "\n".join(notes) + "\n\n" + "\n".join(flags)


_MODELS = {"ctr": "CTR", "two-tower": "two-tower"}


def _white_box_row(doc, s) -> list:
    return [
        _MODELS[_audited_model(doc)],
        NOT_DP.get(s["mechanism"], s["mechanism"]),
        _white_box_observed(doc, s),
        "—" if s["claimed_epsilon"] is None else f"{s['claimed_epsilon']:g}",
        _white_box_run_epsilon(doc, s),
        f"{s['noise_multiplier']:.3g}",
        ", ".join(f"{b:.2f}" for b in s["epsilon_lb"]),
        ", ".join(f"{b / s['claimed_epsilon']:.2f}" for b in s["epsilon_lb"]) if s["claimed_epsilon"] else "—",
    ]


def _white_box_runs(doc, setting) -> list:
    return [
        r
        for r in doc["runs"]
        if (r["mechanism"], r["claimed_epsilon"]) == (setting["mechanism"], setting["claimed_epsilon"])
    ]


def _white_box_observed(doc, setting) -> str:
    """What the auditor read: each step's update (runs before the released-table rows say nothing)."""
    observed = {r.get("observe", "update") for r in _white_box_runs(doc, setting)}
    return ", ".join("released table" if o == "released" else o for o in sorted(observed))


def _white_box_run_epsilon(doc, setting) -> str:
    epsilons = {r.get("accountant_epsilon") for r in _white_box_runs(doc, setting)} - {None}
    return ", ".join(f"{e:.3g}" for e in sorted(epsilons)) or "—"


def _white_box_eana_gap(doc) -> str:
    """How far EANA's bound is above dense DP-SGD's at the same sigma (the largest claimed epsilon)."""
    settings = doc["settings"]
    eana = next((s for s in settings if s["mechanism"] == "eana"), None)
    dense = [s for s in settings if s["mechanism"] == "dense" and s["claimed_epsilon"]]
    if eana is None or not dense:
        return ""
    top = max(dense, key=lambda s: s["claimed_epsilon"])
    gap = eana["epsilon_lb_median"] - top["epsilon_lb_median"]
    head = f" EANA (not DP) at dense DP-SGD's σ for ε = {top['claimed_epsilon']:g}: median bound "
    if _audited_model(doc) == "two-tower":
        return head + (
            f"{eana['epsilon_lb_median']:.2f}, dense DP-SGD's {top['epsilon_lb_median']:.2f}: on a scored table "
            "every row is touched every step, so EANA noises every row, as DP-SGD does."
        )
    return head + (
        f"{eana['epsilon_lb_median']:.2f}, higher than dense DP-SGD's {top['epsilon_lb_median']:.2f} by {gap:.2f} "
        f"and above the ε = {top['claimed_epsilon']:g} DP-SGD claims at that σ: the rows of canaries left out get no "
        "noise, so their scores are exactly 0."
    )


def build_privacy_audit_two_tower(runs):
    run = latest(
        runs, "privacy_audit", where=lambda doc: _audited_model(doc) == "two-tower" and _canary_kind(doc) == "rare-id"
    )
    if run is None:
        return None
    doc, config = run.doc, run.doc["config"]
    rows = [
        [
            NOT_DP.get(s["mechanism"], s["mechanism"]),
            "—" if s["claimed_epsilon"] is None else f"{s['claimed_epsilon']:g}",
            f"{s['noise_multiplier']:.3g}",
            ", ".join(f"{b:.2f}" for b in s["epsilon_lb"]),
            ", ".join(f"{c}/{g}" for c, g in zip(s["correct"], s["guesses"])),
            ", ".join(f"{a}/{b}" for a, b in zip(s["zero_scores_in"], s["zero_scores_out"])),
            ", ".join(
                f"{r['log_prob']['epsilon_lb']:.2f}"
                for r in doc["runs"]
                if (r["mechanism"], r["claimed_epsilon"]) == (s["mechanism"], s["claimed_epsilon"])
            ),
        ]
        for s in doc["settings"]
    ]
    header = ["mechanism", "claimed ε", "σ", "ε lower bound (95 %), each run", "correct / guesses"]
    header += ["rows that never moved (in / out)", "bound from log P alone"]
    setup = (
        f"`pipelines.movielens --audit-canaries {config['num_canaries']}` runs on {_dataset(config)} "
        f"({config['epochs']} epochs, "
        f"batch {config['batch_size']}, clip {config['l2_norm_clip']}, δ = {config['delta']:g}): each canary a movie "
        "id of its own (context [id], label id), in with probability 1/2. Score: how far the canary's history row "
        "moved from its initial value in the released model; last column: the pipeline's own score, log P(label | "
        "context). Tightest of Steinke et al. and the f-DP analyses, 95 %. DP-FEST / DP-AdaFEST+: refused by the "
        "two-tower pipeline (a selection made before training would leave the full softmax's other item rows at "
        "their initial values; CTR section above).\n\n"
    )
    ceiling = f"\n\nWith m = {config['num_canaries']} canaries no outcome proves more than ε = "
    ceiling += f"{doc['max_provable_epsilon']:.2f}."
    flags = "\n\n" + "\n".join(doc["flags"]) if doc["flags"] else "\n\nNo DP mechanism's bound exceeded its claimed ε."
    return [run], setup + table(header, rows) + ceiling + _two_tower_gaps(doc) + _two_tower_cap(doc) + flags


def _two_tower_cap(doc) -> str:
    """Why EANA's and none's bounds stop below the ceiling: included canaries that were never sampled."""
    capped = [s for s in doc["settings"] if s["mechanism"] in NOT_DP and s["correct"] == s["guesses"]]
    if not capped:
        return ""
    never = sorted({n for s in capped for n in s["zero_scores_in"]})
    return (
        f" EANA and the non-private run guessed every canary of their best pair right ({capped[0]['correct'][0]}/"
        f"{capped[0]['guesses'][0]}): the leak is larger than the bound shows, but {never[0]}–{never[-1]} included "
        "canaries were never drawn into a Poisson batch, so their rows sit at their initial values like the "
        "excluded ones' and no larger pair is all right."
    )


def _dataset(config) -> str:
    """The ratings' folder name (ml-100k), never a machine path."""
    return os.path.basename(os.path.dirname(config["data_path"])) or "the pipeline's data"


def _two_tower_gaps(doc) -> str:
    gaps = doc.get("gaps") or {}
    parts = [f"{NOT_DP[name]} higher by {gaps[name]:.2f}" for name in ("eana", "none") if name in gaps]
    if not parts:
        return ""
    return (
        f" Median bounds against {gaps['reference']} ({gaps['reference_median']:.2f}, EANA's σ): "
        + "; ".join(parts)
        + f"; the highest bound of any DP run is {gaps['dp_max']:.2f}."
    )


def build_memory(runs):
    run = latest(runs, "criteo_memory")
    if run is None:
        return None
    cells = {(r["rows"], r["mechanism"], r["streaming"]): r for r in run.doc["results"]}
    columns = sorted({(m, s) for _, m, s in cells})
    rows = [
        [f"{n:,}", *[gib((cells.get((n, m, s)) or {}).get("peak_rss_bytes")) for m, s in columns]]
        for n in sorted({n for n, _, _ in cells})
    ]
    header = ["rows", *[f"{m}, streaming {s}" for m, s in columns]]
    return [run], "Peak RSS of one pipeline process.\n\n" + table(header, rows)


def build_checkpoint(runs):
    run = latest(runs, "checkpoint_time")
    if run is None:
        return None
    rows = []
    for r in run.doc["rows"]:
        save, write = r["save"]["median_s"], r["plain_write"]["median_s"]
        restore, read = r["restore"]["median_s"], r["plain_read"]["median_s"]
        rows.append(
            [f"{r['vocab']:,}", f"{save:.3f} s", times(save / write), f"{restore:.3f} s", times(restore / read)]
        )
    return [run], table(["vocab", "DP save", "÷ plain write", "DP restore", "÷ plain read"], rows)


def build_traffic(runs):
    used = [r for r in runs if r.benchmark == "traffic"]
    used = sorted({(r.doc.get("settings") or {}).get("zipf"): r for r in used}.values(), key=lambda r: r.date)
    if not used:
        return None
    cells, columns = {}, []
    for run in used:
        zipf = (run.doc.get("settings") or {}).get("zipf")
        for r in run.doc["rows"]:
            column = f"{power(r['vocab'])}" + ("" if zipf is None else f", Zipf {zipf}")
            columns += [] if column in columns else [column]
            cells[(r["mechanism"], column)] = f"{r['worker_to_ps_bytes_per_step'] / 1e6:.3g} MB"
    rows = [[m, *[cells.get((m, c), "not measured") for c in columns]] for m in ordered({m for m, _ in cells})]
    intro = "Worker → parameter-server bytes per step, by table rows (uniform ids unless Zipf is named).\n\n"
    return used, intro + table(["mechanism", *columns], rows)


def build_phantom(runs):
    """Each (positions, V, batch) row from the latest run that measured it (a follow-up re-runs some rows)."""
    blocks: dict = {}
    for run in (r for r in runs if r.benchmark == "phantom"):
        found: dict = {}
        for r in run.doc.get("results", []):
            found.setdefault((r["positions"], r["vocab"], r["batch"]), {})[r["method"]] = r
        blocks |= {key: (methods, run) for key, methods in found.items()}
    if not blocks:
        return None
    rows = []
    for (p, v, b), (methods, run) in sorted(blocks.items()):
        ratio = [times((methods.get(m) or {}).get("ratio_to_non_private")) for m in ("phantom", "brute_force")]
        rows.append([p, f"{v:,}", str(b), *ratio, run.short_date])
    used = sorted({run for _, run in blocks.values()}, key=lambda run: run.date)
    header = ["positions scored", "V", "batch", "Phantom ÷ non-private", "brute force ÷ non-private", "run"]
    return used, table(header, rows, "lrrrrl")


def build_vocabulary(runs):
    movielens = latest(runs, "dp_vocabulary", where=lambda doc: bool(doc.get("movielens")))
    sequential = latest(runs, "dp_vocabulary", where=lambda doc: bool(doc.get("sequential")))
    used = [run for run in (movielens, sequential) if run is not None]
    if not used:
        return None
    rows = []
    for r in movielens.doc["movielens"] if movielens else []:
        metric = f"recall@10 {r['recall@10']:.4f}" if "recall@10" in r else r.get("error", "")
        rows.append(
            [
                "MovieLens ml-100k, dense",
                r["setting"],
                metric,
                str(r.get("movies_in_map", "—")),
                str(r.get("unranked_test_positions", "—")),
                num(r.get("epsilon"), 2),
            ]
        )
    for r in sequential.doc["sequential"] if sequential else []:
        rows.append(
            [
                "Amazon Games, DPFormer",
                r["setting"],
                f"NDCG@10 {r['ndcg@10']:.4f}",
                str(r.get("items")),
                str(r.get("unknown_test_targets", "—")),
                num(r.get("epsilon"), 2),
            ]
        )
    header = ["pipeline", "item ids", "metric", "ids kept", "unrankable test targets", "ε"]
    return used, table(header, rows, "llrrrr")


def build_calibration(runs):
    run = latest(runs, "calibration_time")
    if run is None:
        return None
    rows = [
        [
            r["case"],
            r["checkout"],
            f"{r['noise_multiplier']:.6f}",
            f"{r['seconds']['plan']['median_s']:.2f} s",
            f"{r['seconds']['budget']['median_s']:.2f} s",
            str(r["max_steps"]),
            "holds" if r.get("guarantee_holds") else "does not hold",
        ]
        for r in run.doc["rows"]
    ]
    header = ["case", "checkout", "σ", "plan", "budget", "steps that fit", "guarantee"]
    return [run], table(header, rows, "lllrrrl")


QUESTIONS = (
    Question(
        "Step time vs vocabulary",
        "How much slower is each mechanism's DP step than the non-private step as the embedding table grows (10⁵–5·10⁷ rows × 64)? Each cell is the latest run measuring it.",
        ("step_time",),
        build_sweep,
    ),
    Question(
        "Step time with Zipf ids",
        "The same ratio when ids follow a Zipf law (a = 1.1), as real categorical features do.",
        ("step_time",),
        build_zipf,
    ),
    Question(
        "Step time at 10⁸ rows × 16",
        "The same ratio at issue 21's scale, from runs with three processes per mechanism (the latest per mechanism).",
        ("step_time",),
        build_scale,
    ),
    Question(
        "Against dense DP-SGD and tensorflow-privacy",
        "How many times faster is each sparse mechanism's step than dense DP-SGD, ours and tensorflow-privacy's `DPKerasSGDOptimizer`, in the latest run that measured them?",
        ("step_time",),
        build_peers,
    ),
    Question(
        "Keras 3 vs tf-keras: the DP step",
        "Is the Keras 3 front end's DP step within 1.1× of the tf-keras step on the same model (issue 29)? "
        "`step_time --front-end both`: each mechanism under tf-keras (legacy SGD) and Keras 3 "
        "(`keras.optimizers.SGD`, momentum 0), same table, batch and mechanism.",
        ("step_time",),
        build_front_ends,
    ),
    Question(
        "End to end: Criteo pipeline wall time",
        "How much longer does a DP run of `python -m pipelines.criteo` (200k generated rows, 1 epoch) take than the non-private one, start to finish?",
        ("end_to_end",),
        build_end_to_end,
    ),
    Question(
        "Input pipeline: one DP epoch",
        "How fast is one DP epoch's exact Poisson sampling from a file (one pass with spill, or several passes) compared with a plain read?",
        ("streaming",),
        build_streaming,
    ),
    Question(
        "Utility: Criteo real rows, AUC vs ε",
        "What does each mechanism cost in AUC on real Criteo rows (7,200 training rows: direction only, one AUC's standard error is about 0.02)?",
        ("criteo_realdata",),
        build_criteo,
    ),
    Question(
        "Utility: DP-FEST / DP-AdaFEST trade-off (Figure 3)",
        "How much smaller can the noised embedding gradient be than LazyDP's within a given AUC loss?",
        ("fest_tradeoff",),
        build_fest,
    ),
    Question(
        "Utility: MovieLens two-tower retrieval",
        "Precision and recall@k of a two-tower model on ml-100k, DP vs non-private; and, with the user as the "
        "privacy unit (all their ratings, at most k per step), what user-level DP costs against example level at "
        "the same ε, and which k is best.",
        ("movielens_utility", "movielens_user_level"),
        build_movielens,
    ),
    Question(
        "Utility: DP retrieval task vs TFRS in-batch",
        "Recall@k and step time of the DP Retrieval task (full or sampled softmax) on ml-100k against the same "
        "model without DP, a TFRS in-batch model tuned on a validation split, and the most popular movies: "
        "the DP gap against the non-private control is the cost of the noise.",
        ("retrieval", "retrieval_step"),
        build_retrieval,
    ),
    Question(
        "Utility: a Keras 3 two-tower with DP (examples/keras3_two_tower.py)",
        "Recall@10 on ml-100k of a plain Keras 3 two-tower (user and movie towers, full softmax over the "
        "catalogue) trained through `tfdp_embed.keras3` with DP-SGD at ε = 3, against the same model without DP.",
        ("keras3_two_tower",),
        build_keras3_two_tower,
    ),
    Question(
        "Utility: DPFormer Table 2 (Amazon Games)",
        "How close do DP sequential recommenders get to DPFormer's Table 2 when item frequencies are released with DP?",
        ("dpformer_table2",),
        build_dpformer,
    ),
    Question(
        "Privacy audit: secret sharer",
        "How much does an attacker learn about canaries inserted into MovieLens training data, with and without DP?",
        ("secret_sharer",),
        build_secret_sharer,
    ),
    Question(
        "Privacy audit: one-run ε lower bound",
        "How much privacy loss can one training run with rare-id canaries prove (Steinke, Nasr & Jagielski 2023), per mechanism, against the ε it claims?",
        ("privacy_audit",),
        build_privacy_audit,
    ),
    Question(
        "Privacy audit: white-box gradient canaries",
        "How close does a one-run audit that sees the noised updates, or the table a mechanism releases, get to the ε each mechanism claims (Dirac gradient canaries, f-DP analysis), on the CTR model's table and the two-tower's scored item table?",
        ("privacy_audit",),
        build_privacy_audit_white_box,
    ),
    Question(
        "Privacy audit: rare-id canaries in the MovieLens two-tower",
        "The same one-run audit on the two-tower model (`benchmarks.privacy_audit --model two-tower`): does each DP "
        "mechanism's bound stay below its claimed ε, and how much higher are EANA's and the non-private run's?",
        ("privacy_audit",),
        build_privacy_audit_two_tower,
    ),
    Question(
        "Memory: Criteo pipeline peak RSS",
        "How much memory does training take as the data grows, and does streaming keep it flat?",
        ("criteo_memory",),
        build_memory,
    ),
    Question(
        "Checkpoints",
        "What does a DP checkpoint (mechanism state, ledger, checksummed manifest) cost against a plain `tf.train.Checkpoint`?",
        ("checkpoint_time",),
        build_checkpoint,
    ),
    Question(
        "Parameter-server traffic",
        "How many bytes does a worker send to the parameter servers per step, per mechanism?",
        ("traffic",),
        build_traffic,
    ),
    Question(
        "Phantom Clipping",
        "What does DP cost for DPFormer's shared input/output table with Phantom Clipping, against brute-force per-example norms?",
        ("phantom",),
        build_phantom,
    ),
    Question(
        "Privacy planning time",
        "How long does the privacy planning take before the first step (σ calibration and the budget's start)?",
        ("calibration_time",),
        build_calibration,
    ),
    Question(
        "DP vocabularies: what the id maps cost",
        "What do the item ids cost when they are released with DP (`dp_vocabulary`, unit = user) instead of read "
        "off the data? MovieLens recall@10 ratings-only vs with the `u.item` catalogue; sequential NDCG@10 with a "
        "stand-in catalogue vs the DP vocabulary. Test targets outside the ids kept count as misses.",
        ("dp_vocabulary",),
        build_vocabulary,
    ),
)


# -- headline ---------------------------------------------------------------------------
def _range(values) -> str:
    low, high = min(values), max(values)
    return times(low) if f"{low:.2f}" == f"{high:.2f}" else f"{times(low)[:-1]}–{times(high)}"


def _label(mechanism: str) -> str:
    return f"{mechanism} (not DP)" if mechanism == "eana" else mechanism


def _step_line(cells, label):
    used, parts = [], []
    for mechanism in ordered({m for m, _ in cells} - {"none"}):
        found = [(row, run) for (m, _), (row, run) in cells.items() if m == mechanism]
        parts.append(f"{_label(mechanism)} {_range([row['ratio_to_none'] for row, _ in found])}")
        used += [run for _, run in found]
    return label, "; ".join(parts), sorted(set(used), key=lambda run: run.date)


def _speed_lines(runs) -> list:
    lines = []
    for cells, label in (
        (step_cells(runs, dim=64), "DP step ÷ non-private step, 10⁵–5·10⁷ rows × 64"),
        (step_cells(runs, dim=16, min_repeats=3), "DP step ÷ non-private step, 10⁸ rows × 16"),
    ):
        if cells:
            lines.append(_step_line(cells, label))
    cells = front_end_cells(runs)
    if cells:
        ratios = [entry["keras3_over_keras2"] for (m, _), (entry, _) in cells.items() if m != "none"]
        rows = ", ".join(power(v) for v in sorted({v for _, v in cells}))
        used = sorted({run for _, run in cells.values()}, key=lambda run: run.date)
        lines.append((f"Keras 3 DP step ÷ tf-keras DP step, {rows} rows", _range(ratios), used))
    peers = build_peers(runs)
    if peers:
        (run,) = peers[0]
        speedups = run.doc["speedups_vs_dense"]
        dense = [s["dense_over_mechanism"] for s in speedups if s.get("dense_over_mechanism")]
        tfp = [s["tfp_keras_sgd_over_mechanism"] for s in speedups if s.get("tfp_keras_sgd_over_mechanism")]
        value = f"{_range(dense)} over ours" + (f", {_range(tfp)} over tensorflow-privacy" if tfp else "")
        rows = ", ".join(sorted({power(s["vocab"]) for s in speedups}))
        lines.append((f"Sparse mechanisms' speed-up over dense DP-SGD at {rows} rows", value, [run]))
    lines += _opacus_shape_memory(runs)
    run = latest(runs, "end_to_end", where=lambda doc: len(doc.get("summary") or {}) >= 4)
    if run:
        summary = run.doc["summary"]
        base = summary["none"]["wall_s"]
        ratios = [f"{_label(m)} {times(summary[m]['wall_s'] / base)}" for m in ordered(summary) if m != "none"]
        lines.append(("Criteo pipeline end to end, DP wall ÷ non-private", "; ".join(ratios), [run]))
    run = latest(runs, "retrieval", where=lambda doc: bool(doc.get("interleaved")))
    if run:
        side = run.doc["interleaved"]
        label = f"DP retrieval step ÷ same-model non-private step (ml-100k, {side['negatives']}, side by side)"
        value = f"{side['mechanism']} {times(side['wall_ratio'])} wall, {times(side['cpu_ratio'])} CPU"
        lines.append((label, value, [run]))
    return lines


def _opacus_shape_memory(runs) -> list:
    """Peak RSS per mechanism at Opacus's ghost-clipping example shape (10⁶ × 5 table, batch 16,384)."""

    def at_shape(doc) -> bool:
        settings = doc.get("settings") or {}
        return settings.get("dim") == 5 and settings.get("batch") == 16384 and tf_keras_only(doc)

    run = latest(runs, "step_time", where=at_shape)
    if run is None:
        return []
    rows = [r for r in run.doc.get("results", []) if r.get("peak_rss_mb")]
    value = "; ".join(f"{_label(r['mechanism'])} {r['peak_rss_mb'] / 1024:.2f} GB" for r in rows)
    return [("Peak RSS (whole process), 10⁶ × 5 table, batch 16,384 (Opacus's ghost-clipping shape)", value, [run])]


def _utility_lines(runs) -> list:
    lines = []
    run = latest(runs, "criteo_realdata")
    if run:
        aucs = [r["auc"] for r in run.doc["runs"] if r["mechanism"] not in ("none", "eana")]
        base = [r["auc"] for r in run.doc["runs"] if r["mechanism"] == "none"]
        value = f"{min(aucs):.3f}–{max(aucs):.3f} vs {num(base[0] if base else None)}"
        lines.append(("Criteo real rows, AUC: DP (every DP mechanism and ε) vs non-private", value, [run]))
    run = latest(runs, "movielens_utility")
    if run:
        shown = [f"{_label(r['mechanism'])} {r['recall@10']:.4f}" for r in run.doc["runs"]]
        epsilons = sorted({f"{r['epsilon']:.2f}" for r in run.doc["runs"] if r.get("epsilon") is not None})
        lines.append((f"MovieLens two-tower recall@10 (DP at ε = {', '.join(epsilons)})", "; ".join(shown), [run]))
    run = latest(runs, "dpformer_table2", prefix="dpformer_table2-eps8-5")
    if run:
        rows = [r for r in run.doc["rows"] if r["epsilon_target"] != "non-private"]
        shown = [f"{r['model']} ε {r['epsilon_target']}: {r['ndcg@10_pct']:.2f}" for r in rows]
        lines.append(("DPFormer Table 2 (Amazon Games), NDCG@10 %", "; ".join(shown), [run]))
    return lines


def headline(runs, page_dir: str) -> str:
    """The key ratios, each from the JSON files it links."""
    lines = _speed_lines(runs) + _utility_lines(runs)
    if not lines:
        return ""
    rows = [[label, value, ", ".join(link(r, page_dir, r.short_date) for r in used)] for label, value, used in lines]
    return "## Headline\n\n" + table(["question", "measured", "from"], rows, "lll")
