"""Provides what every surface does between the scenario and the screen (stdlib only: no torch, no textual), so the
CLI commands, the live UI and the exporter map their flags, keys or metrics onto one path and draw what comes back:

    scenario (decodetop.budget.scenario)                    the model on a deployment, from the shared flags
      → plan_runner.PlanRunner / run_model_plan            the probes a plan needs, one at a time: the GPU guard
                                                            (gpu_guard), telemetry paused for latency-sensitive
                                                            probes, history and taps as callbacks
      → context.BudgetContext                               scenario, results, observed step, target, GPU hint,
                                                            group kind, stored-at times, now, plan, and how figures
                                                            of unmeasured points are obtained
      → composition.compose                                 the one composition (per rank too: ranks)
      → Budget: the CLI table, the UI's bar, the JSON, the Prometheus series

    observed.observed_step      the observed-step rule: flag > settings > server > trace > default
    fingerprints                which stored results may feed a budget
    plan_report                 a plan run as JSON and text

`decodetop.budget` stays the arithmetic and the model knowledge, `decodetop.probes` the probes; import the
submodule that holds a name.
"""
