#!/bin/bash
# Written by hpctorch submit: one task per node runs `hpctorch run`, which starts
# $nproc worker(s) per node.
#flux: --job-name=$job_name
#flux: -N $nodes
#flux: --exclusive
#flux: -t ${time_minutes}m
#flux: --output=$output
$directives
flux run -N $nodes --tasks-per-node=1 $flux_resources$command
