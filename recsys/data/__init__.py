"""The data layer: the batch contract, the FeatureSpec, value checks and their errors, the registry of
data formats (`data_formats`) and one module per format (split-binary, split-TFRecords, HugeCTR/SOK,
TorchRec/MLPerf, NVTabular and multi-hot TFRecords columns, CSV, synthetic), with their shared
reader and writer bases."""
