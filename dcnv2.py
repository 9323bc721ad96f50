"""V5 (DLRM_and_DCNv2) entry point of DCNv2: main.py's flags and code with V5's DCNv2 defaults
(Adam, the cross interaction, learning rate 1e-4 after 100 warmup steps).

`python dcnv2.py --dataset_path /data/preprocessed ...`, or under `horovodrun` (docs/v5.md).
"""
import main

DCNV2_DEFAULTS = main.V5_DEFAULTS | {"optimizer": "adam", "interaction": "cross", "learning_rate": 0.0001,
                                     "warmup_steps": 100}

if __name__ == "__main__":
    main.main(DCNV2_DEFAULTS)
