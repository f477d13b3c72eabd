"""Planning a private run: from the privacy target to the calibrated mechanism, its ledger, budget and report.

    size = release_dataset_size(N)          # N~: N with Gaussian noise; q, delta and T come from it
    q = size.sampling_probability(B)
    plan = plan_run("adafest", target_epsilon=3.0, target_delta=size.delta(), sampling_probability=q,
                    steps=size.steps(E, B), releases=[Release.dataset_size(size),
                    Release("output_calibration", epsilon_share=0.05)],
                    contribution_clip=1.0, threshold_sigmas=2.0)
    dp_model = DPModel(model, mechanism=plan.mechanism, expected_batch_size=q * size.value)
    budget = plan.budget()
    dp_model.fit(batches, epochs=E, callbacks=[budget])   # Poisson batches sampled with q
    report = plan.report(dp_model=dp_model, ledger=budget.ledger, dataset_size=size)

The training noise sigma is the smallest whose steps, composed with every
release given as an event, meet the epsilon left after the pure-DP shares
(`accounting.periods.calibrate_periods`, one period or the noisiest of
several). What each mechanism gets is read from its class (`is_dp`, its
constructor's keywords), never from its name:

    takes `noise_multiplier` (dense, lazy)      sigma
    takes `contribution_noise_multiplier`       (sigma1, sigma2) = split_noise_multiplier(sigma, ratio), so
      (adafest, adafest+)                       the step is DP-SGD's Gaussian with sigma (DP-AdaFEST §3.3)
    takes `selection_epsilon` (fest, adafest+)  eps1 of the `Release.selection` share, per selection
    `is_dp` False (eana)                        sigma as dense would need: NOMINAL, no epsilon is claimed
    no `noise_multiplier` (none)                nothing

One-off releases charged to the same budget (`Release`):

    Release.dataset_size(size)                  the Gaussian release of N (`release_dataset_size`): a report
                                                then states N~ only (an int N is stated as public, an assumption)
    Release(name, epsilon_share=s)              pure (s x eps, 0)-DP, basic composition: training gets the
                                                rest; its ledger event is Laplace(1 / (s x eps)), exactly s x eps-DP
    Release.selection(s, count=P)               the same for a DP selection (P times, s x eps / P each); the
                                                mechanism records its own selection events
    Release(name, epsilon_share=s, noise=...)   a Gaussian/Laplace release sized so that it alone is
                                                (s x eps, delta)-DP, composed with the steps by the accountant
    Release(name, event=e)                      any `dp_accounting` event, composed with the steps

References: Abadi et al. 2016 (DP-SGD calibration); Dwork & Roth 2014
§3.5 (composition); DP-FEST (NeurIPS 2023) App. C.3 (selection + steps),
§3.3 (AdaFEST's split), §4.3 (streaming periods).

Modules: `releases` (`Release`, `PlannedRelease`: what a one-off release
costs), `run_plan` (`RunPlan`: the plan's mechanism, ledger, budget and
report), `plan` (`plan_run`: calibration and the mechanism's arguments),
`selection` (`select_privately`: private hyperparameter search, Papernot &
Steinke 2022, the whole search one ledger event), `search_plan`
(`plan_search`: the runs' noise for a target epsilon of the whole search),
`search_report` (`search_report`: the selected model's report, the search's epsilon).
"""

from tfdp_embed.planning.plan import plan_run
from tfdp_embed.planning.releases import ACCOUNTANT, BASIC, SELECTION, PlannedRelease, Release
from tfdp_embed.planning.run_plan import RunPlan
from tfdp_embed.planning.search_plan import SearchPlan, plan_search
from tfdp_embed.planning.search_report import search_report
from tfdp_embed.planning.selection import SelectionResult, plan_event, select_privately

__all__ = [
    "ACCOUNTANT",
    "BASIC",
    "SELECTION",
    "PlannedRelease",
    "Release",
    "RunPlan",
    "SearchPlan",
    "SelectionResult",
    "plan_event",
    "plan_run",
    "plan_search",
    "search_report",
    "select_privately",
]
