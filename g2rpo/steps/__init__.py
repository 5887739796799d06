"""The pipeline's steps as library functions: URIs and a validated config in, a typed result out.

The only place that sequences the pipeline; the CLI and the KFP components call
these functions and nothing else of the pipeline.
"""
