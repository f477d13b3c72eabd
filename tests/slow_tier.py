"""The tests that run with `make test-slow` only: one list, each entry with its reason.

CI (2 cores, a clean clone) must run `make test` in about 15 minutes. The
default run keeps, for every privacy exit and every mechanism, at least one
case on each front end; what is listed here repeats a covered case for more
mechanisms, front ends, parameters or whole pipeline runs, or is a long
end-to-end run. `make test-slow` runs them (and the tests marked `slow` in
place). Entries are `fnmatch` patterns over pytest node ids; conftest.py
marks what they match, and tests/test_slow_tier.py checks that each entry
still names a test.

The costs in the comments are seconds measured in one loaded run of the
whole suite (2026-12-07, 2 workers): about 3x a quiet run's.
"""

from __future__ import annotations

import fnmatch

# The Keras 3 half of a both-front-ends test keeps dense DP-SGD and LazyDP (the dense and the sparse,
# deferred path); the tf-keras half keeps every mechanism. The engine below both is the core's.
_KERAS3_SELECTION = ("fest", "adafest", "adafest+", "eana", "DPFEST", "DPAdaFEST", "DPAdaFESTPlus", "EANA")

SLOW: dict[str, str] = {
    # --- whole pipeline runs: one mechanism each stays (make run covers the defaults end to end)
    "tests/pipelines/test_criteo_pipeline.py::test_end_to_end_report_and_saved_model[[]none]": "lazy and fest stay",
    "tests/pipelines/test_criteo_pipeline.py::test_end_to_end_report_and_saved_model[[]adafest]": "lazy, fest stay",
    "tests/pipelines/test_criteo_pipeline.py::test_end_to_end_report_and_saved_model[[]adafest+]": "fest stays",
    "tests/pipelines/test_criteo_pipeline.py::test_streaming_and_in_memory_periods_hold_the_same_rows": "46 s",
    "tests/pipelines/test_movielens_pipeline.py::test_every_mechanism_reports_metrics_and_the_right_guarantee": (
        "170 s of runs; test_movielens_user_level trains every mechanism"
    ),
    "tests/pipelines/test_criteo_defaults.py::test_cli_defaults_on_1000_generated_rows_stay_near_the_base_rate": "78 s",
    "tests/pipelines/test_criteo_defaults.py::test_vocabulary_table3_keeps_table_3_uncapped_whatever_the_rows": "52 s",
    "tests/pipelines/test_criteo_defaults.py::test_top_min_rows_keeps_small_tables_whole_*": "43 s",
    "tests/pipelines/test_criteo_defaults.py::test_a_diverging_run_stops_without_exporting[[]none]": "dense stays",
    "tests/pipelines/test_criteo_nonprivate_defaults.py::test_non_private_defaults_do_not_diverge_*": "24 s",
    "tests/pipelines/test_sequential_pipeline.py::test_non_private_reference_and_private_frequencies": "36 s",
    "tests/pipelines/test_sequential_pipeline.py::test_dpformer_run_report_and_reloaded_saved_model": "30 s",
    "tests/pipelines/test_sequential_pipeline.py::test_popularity_prior_uses_the_run_frequencies": "27 s",
    "tests/privacy/test_sequential_frequencies.py::test_prior_and_head_rows_come_from_the_release": "27 s",
    "tests/privacy/test_sequential_frequencies.py::test_public_file_is_shipped_exactly_*": "29 s",
    "tests/pipelines/test_sequential_layouts.py::test_s3rec_file_trains_for_max_steps_*": "31 s",
    "tests/pipelines/test_criteo_defaults.py::test_single_class_eval_reports_null_auc_with_a_reason": "29 s",
    "tests/pipelines/test_quality_reports.py::test_criteo_dead_model_and_skipped_half_of_a_file_are_warned": "23 s",
    "tests/pipelines/test_movielens_user_level.py::test_user_level_on_ml_latest_ratings_csv_*": "ml-1m's stays",
    "tests/pipelines/test_issue35_requests.py::test_a_stray_sequence_item_id_of_two_million_*": "25 s",
    "tests/data/test_criteo_layouts.py::test_pipeline_trains_on_mixed_layouts_and_serves_their_strings": "46 s",
    "tests/data/test_criteo_layouts.py::test_each_layout_reads_to_the_rows_of_its_tsv[[]csv_no_header_*]": "3 stay",
    "tests/data/test_criteo_layouts.py::test_each_layout_reads_to_the_rows_of_its_tsv[[]tsv_floats_crlf]": "3 stay",
    # --- faults, signals and limits: one case of each kind stays (test_safe_release, test_run_faults)
    "tests/pipelines/test_signals_each_stage.py::*": "102 s; test_safe_release's SIGTERM and Ctrl-C cases stay",
    "tests/pipelines/test_run_faults.py::test_the_budget_spent_by_earlier_runs_on_an_out_is_reported": "92 s",
    "tests/pipelines/test_safe_release.py::test_sigkill_during_export_leaves_only_a_partial_*": "25 s",
    "tests/pipelines/test_full_filesystem.py::*": "40 s; test_run_faults's full disk stays",
    "tests/pipelines/test_run_time_limit.py::test_the_default_criteo_run_is_not_refused_*": "31 s",
    "tests/test_checkpoint.py::test_sigkill_mid_epoch_then_resume_equals_uninterrupted_run": "142 s; resume stays",
    # --- distribution strategies: test_mirrored stays
    "tests/distributed/test_checkpoint_distributed.py::*": "58 s",
    "tests/distributed/test_adafest_mirrored.py::*": "38 s",
    "tests/distributed/test_multi_worker.py::*": "32 s (two worker processes)",
    "tests/distributed/test_parameter_server.py::*": "29 s",
    "tests/privacy/test_capabilities.py::test_renamed_lazy_subclass_is_refused_under_mirrored": "21 s",
    # --- fresh processes and notebooks: the Criteo notebook and the Keras 3 process test stay
    "tests/colab/test_keras3_two_tower_notebook.py::*": "41 s; examples and test_keras3 cover the Keras 3 two-tower",
    "tests/examples/test_keras3_two_tower.py::*": "38 s (a fresh process)",
    "tests/layers/test_embedding_layer.py::test_keras3_in_process_is_refused_with_a_clear_message": (
        "the already-loaded case stays"
    ),
    # --- one mechanism or parameter repeating a covered case
    "tests/models/test_stacked_tables.py::test_zero_noise_and_a_huge_clip_give_the_unstacked_weights[[]none]": "",
    "tests/models/test_stacked_tables.py::test_zero_noise_and_a_huge_clip_give_the_unstacked_weights[[]dense]": "",
    "tests/models/test_stacked_tables.py::test_zero_noise_and_a_huge_clip_give_the_unstacked_weights[[]eana]": "",
    "tests/models/test_stacked_tables.py::test_zero_noise_and_a_huge_clip_give_the_unstacked_weights[[]lazy]": (
        "dense, lazy and eana run on both front ends in test_stacked_both; fest and AdaFEST+ stay"
    ),
    "tests/models/test_stacked_tables.py::test_zero_noise_and_a_huge_clip_give_the_unstacked_weights[[]adafest]": "",
    "tests/models/test_stacked_tables.py::test_released_noise_on_untouched_rows_matches_the_formula[[]dense]": (
        "lazy stays (and test_stacked_both's)"
    ),
    "tests/clipping/test_shared_factored.py::test_factored_norms_and_sums_match_per_example_gradients[[]*float64*]": (
        "the float32 cases stay (the tighter tolerance repeats them)"
    ),
    "tests/clipping/test_shared.py::test_item_tower_norms_and_clipped_sums_match_brute_force[[]*-True]": "False stays",
    "tests/test_mixed_precision.py::test_every_mechanism_trains_with_float32_weights_*[[]*-mixed_bfloat16]": (
        "float16 stays per mechanism; test_coverage_reduced_precision covers bfloat16"
    ),
    "tests/test_mixed_precision.py::test_tiny_gradients_do_not_underflow[[]mixed_bfloat16]": "float16 stays",
    "tests/test_checkpoint_mixed_precision.py::*[[]dense]": "lazy stays",
    "tests/clipping/test_reduced_precision.py::test_rules_match_the_brute_force_jacobian_in_float32[[]*bfloat16]": "",
    "tests/test_losses.py::test_one_dimensional_labels_against_b_by_1_logits_train_like_keras[[]binary_crossentropy-*]": (
        "the loss object with dense and lazy stays"
    ),
    "tests/mechanisms/test_lazy.py::test_per_step_stateless_lazy_equals_dense_dpsgd[[]nesterov]": "momentum stays",
    "tests/mechanisms/test_lazy.py::test_per_step_stateless_lazy_equals_dense_dpsgd[[]momentum_read_hook_only]": "",
    "tests/mechanisms/test_lazy.py::test_aggregated_lazy_matches_dense_in_distribution[[]plain_sgd_fused]": (
        "momentum stays: LazyDP against dense DP-SGD in distribution"
    ),
    "tests/retrieval/test_training.py::test_trains_privately_and_reports_top_k_recall[[]*-sampled]": "full stays",
    "tests/attention/test_re_attention_propagation.py::test_first_order_rules_match_monte_carlo*": (
        "136 s of Monte Carlo; test_re_attention checks each rule against sampling"
    ),
    "tests/user_level/test_unit_norms.py::test_dp_step_clips_each_users_summed_gradient[[]*-0.5]": "0.05, 1e6 stay",
    "tests/privacy/test_batching_claim.py::test_poisson_sampler_is_verified_*[[]keras3-map_repeat_take]": "",
    "tests/privacy/test_per_example_check.py::test_ragged_and_sparse_features_are_checked[[]keras3-sparse]": "",
    "tests/privacy/test_rng_state_never_saved.py::test_the_training_checkpoint_of_an_unseeded_*[[]keras3-lazy]": "",
    "tests/user_level/test_user_level_attacks.py::test_d_user_level_accounting_is_example_*[[]keras3]": (
        "the accounting is the core's; tf-keras stays"
    ),
    "tests/privacy/test_batching_claim.py::test_poisson_sampler_is_verified_*[[]keras3-prefetch]": "",
}
for _test in (  # the Keras 3 half keeps the subclass-norm cases of test_sensitivity
    "tests/privacy/test_sensitivity.py::test_tied_input_and_output_embedding_is_bounded_and_exact",
    "tests/privacy/test_sensitivity.py::test_full_softmax_over_a_shared_catalogue_tower_is_bounded_and_exact",
    "tests/privacy/test_sensitivity.py::test_sigmoid_output_with_a_probability_loss_is_bounded_and_exact",
    "tests/privacy/test_sensitivity.py::test_dense_subclass_overriding_call_gets_exact_norms",
):
    SLOW[f"{_test}[[]keras3]"] = "the Keras 3 half keeps the embedding-subclass cases"
for _test in (
    "tests/user_level/test_user_level_attacks.py::test_a_one_users_history_moves_the_clipped_sum_by_at_most_c",
    "tests/user_level/test_user_level_attacks.py::test_b_zero_noise_huge_clip_is_non_private_training_on_the_same_rows",
    "tests/privacy/test_padding_sensitivity.py::test_every_mechanism_steps_on_a_padded_batch_as_on_the_batch_without_*",
    "tests/privacy/test_report_contents.py::test_report_is_a_function_of_the_release",
    "tests/privacy/test_checkpoint_replay.py::test_two_restores_do_not_share_noise",
):
    for _name in _KERAS3_SELECTION:
        SLOW[f"{_test}[[]keras3-{_name}]"] = "the Keras 3 half keeps dense DP-SGD and LazyDP"


def is_slow(nodeid: str) -> bool:
    """Whether `nodeid` is in the slow tier (`SLOW`)."""
    return any(fnmatch.fnmatchcase(nodeid, pattern) for pattern in SLOW)
