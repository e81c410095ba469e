# The workflow is workflow/Snakefile (the Snakemake workflow catalog's layout: docs/workflow.md#layout);
# this file keeps `snakemake -s Snakefile` working. It includes the workflow as Snakemake includes a main
# Snakefile: the `include:` directive would drop the included file's default target (rule all).
workflow.include("workflow/Snakefile", overwrite_default_target=True)
