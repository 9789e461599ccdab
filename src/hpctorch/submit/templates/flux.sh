#!/bin/bash
# Written by hpctorch submit: $layout
#flux: --job-name=$job_name
#flux: -N $nodes
#flux: --exclusive
#flux: -t ${time_minutes}m
#flux: --output=$output
$directives
flux run -N $nodes --tasks-per-node=$tasks_per_node $flux_resources$command
