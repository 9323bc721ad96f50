"""V5 (DLRM_and_DCNv2) entry point of DLRM: main.py's flags and code with V5's DLRM defaults.

`python dlrm.py --dataset_path /data/preprocessed ...`, or under `horovodrun` (docs/v5.md).
"""
import main

DLRM_DEFAULTS = main.V5_DEFAULTS | {"optimizer": "sgd", "interaction": "dot_custom_cuda", "learning_rate": 24.0,
                                    "warmup_steps": 8000}

if __name__ == "__main__":
    main.main(DLRM_DEFAULTS)
