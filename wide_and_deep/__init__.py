"""NVIDIA's TF2 Wide & Deep recommender (Outbrain click prediction) on this project's foundation."""
