from dmlrepro.digit_trunk_recipe import (
    DIGIT_TRUNK,
    prepared_inputs as digit_trunk_inputs,
)

# The digit-pretrained trunk (docs/models.md#the-digit-pretrained-trunk): the multi-digit datasets'
# ImageNet stand-in, pretrained once per recipe on the dataset's training digits only (MNIST's read
# from the prepared double_mnist / triple_mnist; scikit-learn's need no input), content-addressed;
# runs with model.pretrained: digit_trunk fine-tune from it (rule train and checkpoint search take the
# file as input: trunk_weights; their run config gets its folder: with_trunk_folder, not part of the run id;
# both in rules/common.smk).
TRUNKS = LAYOUT.trunk_dir()  # the folder of the trunk's weights
# recipe hash -> recipe
DIGIT_RECIPES = DIGIT_TRUNK.workflow_recipes(TABLE.all_trained())


rule pretrain_digit_trunk:
    input:
        lambda wildcards: [
            LAYOUT.manifest(name)
            for name in digit_trunk_inputs(DIGIT_RECIPES[wildcards.digits])
        ],
    output:
        weights=str(DIGIT_TRUNK.weights_file_of_hash(TRUNKS, "{digits}")),
    log:
        LAYOUT.log("pretrain_digit_trunk", "{digits}"),
    # first when it is ready: every fine-tuning run waits for it (docs/workflow.md#scheduling)
    priority: 10
    threads: 2  # pretraining always runs 2 torch threads: the weights depend on it (docs/miniature.md)
    params:
        recipe=lambda wildcards: canonical(DIGIT_RECIPES[wildcards.digits]),
        data_root=DATA,
    message:
        "Pretraining the digit trunk {wildcards.digits}"
    script:
        "../scripts/pretrain_digit_trunk.py"
