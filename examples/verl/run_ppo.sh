#!/usr/bin/env bash
# verl's PPO trainer streaming to an rlpulse collector: your usual verl overrides ("$@": model,
# data, batch sizes...), plus the lines below. Start the collector first:
#   python -m rlpulse.collector --config examples/verl/collector.yaml
set -euo pipefail
COLLECTOR=${RLPULSE_ADDRESS:-tcp://127.0.0.1:5555}
RUN=${RUN:-gsm8k-ppo}
exec python -m verl.trainer.main_ppo "$@" \
    trainer.experiment_name="$RUN" \
    trainer.logger='[console,rlpulse]' \
    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rlpulse.producer.integrations.verl.register \
    +ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_ADDRESS="$COLLECTOR" \
    +ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_RUN="$RUN"
