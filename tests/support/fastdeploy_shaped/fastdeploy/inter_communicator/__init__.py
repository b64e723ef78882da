"""A stand-in of FastDeploy's package, for the stand-ins' pickles only (see ../README.md)."""
